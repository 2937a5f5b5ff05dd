"""Strip secrets from text before it is logged or returned
(docs/security.md#secrets-what-never-leaves-the-process).

Why a filter on text and not only care at each call site: secrets reach messages
indirectly — an aiohttp error quoting a webhook URL with `user:password@`, an SMTP
library echoing its login, a gRPC error carrying request metadata. Running every log
line and error detail through `redact` catches what the call sites forgot.

What is removed: bearer/basic credentials and `authorization:` header values, URL
userinfo (`scheme://user:password@host` -> `scheme://[REDACTED]@host`), JSON Web
Tokens, PEM private key blocks, and the values of `password=`, `secret=`, `token=`,
`api_key=`, … in key=value, query-string and JSON form. It errs towards removing: a
word that looks like a credential after "Bearer" goes too.

What it must never do: change text that has no secret-looking part, or take time that
grows faster than the text. Each pattern may start only where a run of its characters
starts (a lookbehind, not `\b`, which would restart inside a run such as "a-a-a-…"),
and once its key has matched it always succeeds, so no failed scan is ever repeated.
"""

from __future__ import annotations

import logging
import re
from typing import Any

MARK = "[REDACTED]"

_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)")
# scheme://userinfo@ — greedy up to the last '@' before the path, so an unencoded '@' in a
# password does not leave its tail behind.
_URL_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*://)[^/\s?#\"'<>]*@")
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
    r"(?:(bearer|basic|token|digest|negotiate)\s+)?[^\s\"',;]+")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]{8,}=*")
_JWT = re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*")
_SECRET_KEYS = (r"password|passwd|pwd|passphrase|secret|client[_-]?secret|api[_-]?key|apikey"
                r"|access[_-]?token|refresh[_-]?token|id[_-]?token|auth[_-]?token|token"
                r"|private[_-]?key")
_KEY_VALUE = re.compile(
    r"(?i)(?<![A-Za-z0-9_\-])([\"']?[A-Za-z0-9_\-]*?(?:" + _SECRET_KEYS + r")[\"']?\s*[:=]\s*)"
    r"(\"(?:[^\"\\\n]|\\.)*\"?|'[^'\n]*'?|[^\s&,;}\]\)\"']+)")


def _header(m: re.Match[str]) -> str:
    scheme = m.group(2)
    return f"{m.group(1)}{scheme + ' ' if scheme else ''}{MARK}"


def _key_value(m: re.Match[str]) -> str:
    value = m.group(2)
    if value[:1] in ("'", '"'):  # keep the quotes (the closing one may be missing)
        close = value[0] if len(value) > 1 and value.endswith(value[0]) else ""
        return f"{m.group(1)}{value[0]}{MARK}{close}"
    return f"{m.group(1)}{MARK}"


def redact(text: str) -> str:
    """`text` with every secret-looking part replaced by [REDACTED]."""
    if not text:
        return text
    text = _PEM_PRIVATE_KEY.sub(MARK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MARK}@", text)
    text = _AUTH_HEADER.sub(_header, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MARK}", text)
    text = _JWT.sub(MARK, text)
    return _KEY_VALUE.sub(_key_value, text)


_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class RedactFilter(logging.Filter):
    """A logging filter (attach it to a handler) that redacts the formatted message and
    every string-valued `extra` field. Tracebacks are formatted later by the formatter
    and are not covered: format them through `redact` there if they can hold secrets."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        for key, value in list(vars(record).items()):
            if key in _RESERVED or key.startswith("_"):
                continue
            new = _redact_value(value)
            if new is not value:
                setattr(record, key, new)
        return True


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        cleaned = redact(value)
        return cleaned if cleaned != value else value
    if isinstance(value, list | tuple) and any(isinstance(v, str) for v in value):
        items = [redact(v) if isinstance(v, str) else v for v in value]
        return type(value)(items) if items != list(value) else value
    return value
