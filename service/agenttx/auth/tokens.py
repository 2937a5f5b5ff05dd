"""`--auth token`: bearer tokens checked against a file of their SHA-256 hashes (docs/security.md#token).

Why hashes: the file is mounted from a Secret and readable by the pod; a hash lets us
recognise a token without a copy of it anywhere on disk. Why re-read it: tokens are
rotated by rewriting the Secret, and a rotation must not need a restart. Kubernetes
updates a Secret volume by writing a new directory and swapping a symlink atomically,
so a `stat` that follows symlinks (inode, size, mtime, ctime) sees every rotation;
the check is rate-limited so a busy server stats the file at most once per interval.

What it must never do: log, return or keep a token, or log the hashes (a hash of a
weak token can be brute-forced). A file that fails to parse or validate keeps the
last good set and logs where it is wrong (entry index, field), never what it holds.
A file missing or broken at start-up is a start-up error.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .principal import AuthConfigError, Principal

log = logging.getLogger(__name__)

DEFAULT_CHECK_INTERVAL_S = 1.0


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    principal: str = Field(min_length=1)
    namespace: str | None = None
    roles: list[str] = Field(default_factory=list)

    @field_validator("namespace")
    @classmethod
    def _non_empty(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise ValueError("must be a non-empty string or absent")
        return v


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: list[_Entry]


class TokenFileError(ValueError):
    """The file's content is not a valid token list. The message says where, not what."""


@dataclass(frozen=True)
class _Known:
    digest: bytes  # raw 32-byte sha256
    principal: Principal


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _signature(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def parse_token_file(data: bytes) -> tuple[_Known, ...]:
    """Parse a token file (YAML, which includes JSON). Raises TokenFileError whose text
    never contains the file's values."""
    try:
        doc: Any = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        # The YAML error's str() quotes the offending line, which may hold a hash.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise TokenFileError(f"not valid YAML/JSON{where}") from None
    try:
        parsed = _File.model_validate(doc)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_input=False, include_url=False):
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            problems.append(f"{loc}: {err['msg']}")
        raise TokenFileError('expected {"tokens": [{"sha256", "principal", "namespace", '
                             '"roles"}, ...]}; ' + "; ".join(problems[:5])) from None
    known: list[_Known] = []
    seen: set[bytes] = set()
    for index, entry in enumerate(parsed.tokens):
        digest = bytes.fromhex(entry.sha256)
        if digest in seen:
            raise TokenFileError(f"tokens.{index}.sha256: the same token hash is listed twice")
        seen.add(digest)
        known.append(_Known(digest, Principal(name=entry.principal, namespace=entry.namespace,
                                              roles=frozenset(entry.roles))))
    return tuple(known)


class TokenFile:
    """The token hashes of one file, re-read when the file changes.

    `lookup(token)` is memory-only; `refresh()` does the (blocking, rate-limited) stat
    and re-read, so an async caller runs it in a thread when `refresh_due()`.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.fspath(path)
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._known: tuple[_Known, ...] = ()
        self._signature: tuple[int, int, int, int, int] | None = None
        self._rejected: tuple[int, int, int, int, int] | None = None
        self._last_check = clock()
        try:
            st = os.stat(self.path)
            data = self._read()
        except OSError as exc:
            raise AuthConfigError(f"--auth-tokens-file {self.path}: cannot read it "
                                  f"({exc.strerror or type(exc).__name__})") from None
        try:
            self._known = parse_token_file(data)
        except TokenFileError as exc:
            raise AuthConfigError(f"--auth-tokens-file {self.path}: {exc}") from None
        self._signature = _signature(st)
        log.info("token file loaded", extra={"path": self.path, "tokens": len(self._known)})

    def _read(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def __len__(self) -> int:
        return len(self._known)

    def refresh_due(self) -> bool:
        return self._clock() - self._last_check >= self.check_interval_s

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the file if it changed since the last good (or rejected) load and the
        check interval has passed (or `force`). True when a new token set took effect."""
        with self._lock:
            now = self._clock()
            if not force and now - self._last_check < self.check_interval_s:
                return False
            self._last_check = now
            try:
                sig = _signature(os.stat(self.path))
            except OSError as exc:
                # Between a Secret's symlink swaps the path can briefly vanish.
                log.warning("token file not readable; keeping the current tokens",
                            extra={"path": self.path, "error": exc.strerror or type(exc).__name__})
                return False
            if sig == self._signature or sig == self._rejected:
                return False
            try:
                known = parse_token_file(self._read())
            except OSError as exc:
                log.warning("token file not readable; keeping the current tokens",
                            extra={"path": self.path, "error": exc.strerror or type(exc).__name__})
                return False
            except TokenFileError as exc:
                self._rejected = sig
                log.error("token file rejected; keeping the last good tokens",
                          extra={"path": self.path, "error": str(exc),
                                 "tokens": len(self._known)})
                return False
            self._known = known
            self._signature = sig
            self._rejected = None
            log.info("token file reloaded", extra={"path": self.path, "tokens": len(known)})
            return True

    def lookup(self, token: str) -> Principal | None:
        """The principal whose hash matches sha256(token), or None. Compares against every
        entry with hmac.compare_digest and never stops early, so the time taken does not
        depend on which entry (if any) matches."""
        digest = _digest(token)
        found: Principal | None = None
        for entry in self._known:
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        return found


def hash_token(token: str) -> str:
    """The hex sha256 to put in the token file for `token` (for tooling and tests)."""
    return _digest(token).hex()
