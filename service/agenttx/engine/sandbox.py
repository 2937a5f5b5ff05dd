"""Files inside a transaction's sandbox root: confinement, atomic writes, saga undo.

Why: `fs.write` changes the real filesystem at step time (other processes can read the
file), so it is undone by compensation rather than by dropping a buffer. Everything here
must keep two promises: nothing is ever written outside the root (absolute paths, `..`,
NUL bytes and symlinks leading out are refused before any write), and a write is
atomic (temp file in the same directory + fsync + rename + directory fsync).

The functions are blocking (disk I/O, fsync); the engine calls them through
`asyncio.to_thread` so the replica's event loop never waits on a disk.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import pathlib
import re
import secrets

from ..tools.base import INVALID_PARAMETER_VALUE, ToolError

log = logging.getLogger(__name__)

# Longest file name (one path component) and path on Linux: NAME_MAX and PATH_MAX
# (the latter counts the terminating NUL) in <linux/limits.h>.
NAME_MAX = 255
PATH_MAX = 4096
# Directory levels below the root. Path.mkdir(parents=True) recurses once per missing
# level, so an unbounded depth would end in RecursionError instead of a clean failure.
MAX_DEPTH = 256


def _escape(path: str) -> ToolError:
    return ToolError(f'permission denied for path "{path}": it resolves outside the sandbox',
                     argument="path", category="insufficient_privilege")


def confine(root: str, path: str) -> pathlib.Path:
    """The absolute path for `path` under `root`, or a ToolError saying why not."""
    if path == "":
        # "path: " names the argument in the hint (serde_path_to_error style)
        raise ToolError('path: invalid value: string "", expected a non-empty relative file path',
                        argument="path", category=INVALID_PARAMETER_VALUE)
    if "\x00" in path:
        shown = path.replace("\x00", "\\u0000")
        raise ToolError(f'path: invalid value: string "{shown}", expected a path without NUL '
                        "bytes", argument="path", category=INVALID_PARAMETER_VALUE)
    pure = pathlib.PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts:
        raise _escape(path)
    if path.endswith("/") or pure.name in ("", "."):
        raise ToolError(f"Is a directory: '{path}'", argument="path",
                        category=INVALID_PARAMETER_VALUE)
    if len(pure.parts) > MAX_DEPTH:
        raise ToolError(f'path: invalid value: string "{path}", expected a path at most '
                        f"{MAX_DEPTH} directories deep", argument="path",
                        category=INVALID_PARAMETER_VALUE)
    if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in pure.parts):
        raise _os_error(OSError(errno.ENAMETOOLONG, "File name too long"), path)
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, path))
    if os.path.commonpath([real_root, target]) != real_root or target == real_root:
        raise _escape(path)
    if len(target.encode("utf-8", "surrogateescape")) >= PATH_MAX:
        raise ToolError(f'path: invalid value: string "{path}", expected a path shorter than '
                        f"{PATH_MAX} bytes under the sandbox root", argument="path",
                        category=INVALID_PARAMETER_VALUE)
    return pathlib.Path(target)


def _os_error(exc: OSError, path: str) -> ToolError:
    """An OSError as a POSIX-style message naming the caller's `path` (never the absolute
    path under the root: the agent must not learn where the sandbox lives)."""
    if exc.errno == errno.ENAMETOOLONG:
        return ToolError(f'path: invalid value: string "{path}", expected a path whose names '
                         f"are at most {NAME_MAX} bytes", argument="path",
                         category=INVALID_PARAMETER_VALUE)
    if exc.errno == errno.ELOOP:
        return ToolError(f'path: invalid value: string "{path}", expected a path without a '
                         "symbolic link loop", argument="path",
                         category=INVALID_PARAMETER_VALUE)
    if isinstance(exc, FileExistsError | NotADirectoryError):
        return ToolError(f"Not a directory: '{path}'", argument="path",
                         category=INVALID_PARAMETER_VALUE)
    return ToolError(f"{exc.strerror or type(exc).__name__}: '{path}'", argument="path")


def read_state(target: pathlib.Path, path: str) -> bytes | None:
    """Current bytes of the file, None if absent. Refuses directories."""
    try:
        return target.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ToolError(f"Is a directory: '{path}'", argument="path",
                        category=INVALID_PARAMETER_VALUE) from None
    except OSError as exc:
        raise _os_error(exc, path) from None


TEMP_PATTERN = re.compile(r"\.agenttx-([0-9a-f-]{36})-(\d+)-([0-9a-f]{12})\.tmp$")


def temp_name(target: pathlib.Path, tx_id: str, step_id: int, attempt: str) -> pathlib.Path:
    """Unique per attempt: two replicas (or two requests) racing on the same step each
    write their own temp file, so the loser discarding its file can never remove, or
    overwrite, the bytes the winner is about to rename into place. The name carries the
    transaction, step and attempt (`.<name>.agenttx-<tx>-<step>-<attempt>.tmp`), so a
    leftover from a crash can be matched to its step and swept (`parse_temp`)."""
    return target.with_name(f"{_hidden_base(target)}.agenttx-{tx_id}-{step_id}-"
                            f"{attempt}.tmp")


RESTORE_PATTERN = re.compile(r"\.agenttx-restore-[0-9a-f]{12}\.tmp$")


def is_restore_temp(name: str) -> bool:
    """A temp file of an undo's restore (renamed at once: any old one is a leftover)."""
    return RESTORE_PATTERN.search(name) is not None


def parse_temp(name: str) -> tuple[str, int, str] | None:
    """(transaction id, step id, attempt) of a temp file name, or None."""
    m = TEMP_PATTERN.search(name)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def new_attempt() -> str:
    return secrets.token_hex(6)


def _hidden_base(target: pathlib.Path) -> str:
    """`.<name>`, or `.<hash of name>` when a long name would push a sibling temp file
    past NAME_MAX (a 255-byte file name is valid; its temp file must be too)."""
    if len(target.name.encode("utf-8", "surrogateescape")) <= NAME_MAX - 96:
        return f".{target.name}"
    return "." + hashlib.sha256(target.name.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temp(target: pathlib.Path, tmp: pathlib.Path, data: bytes, path: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        with contextlib.suppress(OSError):
            discard_temp(tmp)
        raise _os_error(exc, path) from None


def install_temp(tmp: pathlib.Path, target: pathlib.Path) -> None:
    os.replace(tmp, target)
    _fsync_dir(target.parent)


def discard_temp(tmp: pathlib.Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def current_hash(target: pathlib.Path) -> str | None:
    try:
        return sha256(target.read_bytes())
    except OSError:
        return None


def restore(target: pathlib.Path, previous: bytes | None) -> None:
    """Saga undo, idempotent: put back the previous bytes, or remove a file the step
    created (an already-absent file is a success). Raises OSError when it cannot.

    Whatever someone else did to the file after its step (changed it, removed it, put an
    empty directory in its place) is overwritten, as any compensation overwrites: the
    undo's promise is the bytes from before the step. A directory that holds files is
    never removed (that would destroy data the step never wrote): the undo fails with
    EISDIR and the transaction waits for a person (docs/recovery.md, MANUAL)."""
    if target.is_dir() and not target.is_symlink():
        try:
            target.rmdir()
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise IsADirectoryError(errno.EISDIR, "Is a directory") from None
            raise
        log.warning("undo removed an empty directory put where a transaction's file was",
                    extra={"path": str(target)})
    if previous is None:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        with contextlib.suppress(OSError):
            _fsync_dir(target.parent)
        return
    tmp = target.with_name(f"{_hidden_base(target)}.agenttx-restore-{secrets.token_hex(6)}.tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as fh:
        fh.write(previous)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.replace(tmp, target)
    except OSError:
        discard_temp(tmp)
        raise
    _fsync_dir(target.parent)


def confine_root(root: str) -> pathlib.Path:
    return pathlib.Path(os.path.realpath(root))
