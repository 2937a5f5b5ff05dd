"""Parse `arguments_json` the way serde_json would, with serde_json's messages.

Why: a malformed argument document is a failed step, not an RPC error, and its hint
must name line and column. Python's json module has other wording and accepts things
serde rejects (lone surrogates, NaN, unbounded nesting), so we normalise both here.
Never raises anything but ArgumentsError.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# serde_json's default recursion limit (serde_json::de::Deserializer::remaining_depth = 128).
MAX_DEPTH = 128

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
# One escape inside a string: `\uXXXX` (hex captured) or any other `\x` (consumed whole,
# so an escaped backslash followed by `ud800` is text, not an escape).
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


class ArgumentsError(Exception):
    """A serde_json-style message such as `expected value at line 1 column 1`."""


def _position(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, col


def _serde_message(exc: json.JSONDecodeError, text: str) -> str:
    msg = exc.msg
    line, col = exc.lineno, exc.colno
    at_end = exc.pos >= len(text.rstrip())
    if msg.startswith("Expecting value"):
        if at_end:
            return f"EOF while parsing a value at line {line} column {max(col - 1, 0)}"
        return f"expected value at line {line} column {col}"
    if msg.startswith("Expecting property name"):
        if at_end:
            return f"EOF while parsing an object at line {line} column {max(col - 1, 0)}"
        return f"key must be a string at line {line} column {col}"
    if msg.startswith("Expecting ':'"):
        if at_end:
            return f"EOF while parsing an object at line {line} column {max(col - 1, 0)}"
        return f"expected `:` at line {line} column {col}"
    if msg.startswith("Expecting ',' delimiter"):
        opener = _innermost_open(text, exc.pos)
        kind, close = ("an object", "}") if opener == "{" else ("a list", "]")
        if at_end:
            return f"EOF while parsing {kind} at line {line} column {max(col - 1, 0)}"
        return f"expected `,` or `{close}` at line {line} column {col}"
    if msg.startswith("Extra data"):
        return f"trailing characters at line {line} column {col}"
    if msg.startswith("Unterminated string"):
        eline, ecol = _position(text, len(text))
        return f"EOF while parsing a string at line {eline} column {max(ecol - 1, 0)}"
    if msg.startswith("Invalid control character"):
        return f"control character (\\u0000-\\u001F) found while parsing a string at line {line} column {col}"
    if msg.startswith("Invalid \\uXXXX escape"):
        return f"invalid escape at line {line} column {col}"
    if msg.startswith("Invalid \\escape"):
        return f"invalid escape at line {line} column {col}"
    if msg.startswith("Unexpected UTF-8 BOM"):  # serde: a BOM is not whitespace
        return f"expected value at line {line} column {col}"
    if msg.startswith("Illegal trailing comma"):  # Python >= 3.13
        return f"trailing comma at line {line} column {col}"
    return f"{msg[0].lower() + msg[1:]} at line {line} column {col}"


def _innermost_open(text: str, pos: int) -> str:
    stripped = _STRING.sub(lambda m: " " * len(m.group()), text[:pos])
    stack: list[str] = []
    for ch in _BRACKETS.findall(stripped):
        if ch in "[{":
            stack.append(ch)
        elif stack:
            stack.pop()
    return stack[-1] if stack else "{"


def _check_depth(text: str) -> None:
    stripped = _STRING.sub(lambda m: " " * len(m.group()), text)
    depth = 0
    for m in _BRACKETS.finditer(stripped):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            line, col = _position(text, m.start())
            raise ArgumentsError(f"recursion limit exceeded at line {line} column {col}")


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


class _OutOfRange(Exception):
    """A number serde_json cannot hold in an f64 (e.g. 1e400, or 5000 digits)."""

    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


def _parse_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _OutOfRange(literal)
    return value


def _parse_int(literal: str) -> int:
    try:
        return int(literal)
    except ValueError:  # beyond sys.get_int_max_str_digits(): never a usable id or value
        raise _OutOfRange(literal) from None


def _check_surrogates(text: str) -> None:
    """serde_json refuses `\\uXXXX` escapes that do not form a valid code point; Python
    would hand back a str with a lone surrogate that cannot even be encoded as UTF-8."""
    if "\\u" not in text:
        return
    for string in _STRING.finditer(text):
        pending: re.Match[str] | None = None  # a high surrogate waiting for its low half
        for esc in _ESCAPE.finditer(text, string.start() + 1, string.end() - 1):
            code = int(esc.group(1), 16) if esc.group(1) else None
            if pending is not None:
                if esc.start() == pending.end() and code is not None and 0xDC00 <= code <= 0xDFFF:
                    pending = None
                    continue
                _surrogate_error(text, "lone leading surrogate in hex escape", pending)
            if code is None:
                continue
            if 0xD800 <= code <= 0xDBFF:
                pending = esc
            elif 0xDC00 <= code <= 0xDFFF:
                _surrogate_error(text, "invalid unicode code point", esc)
        if pending is not None:
            _surrogate_error(text, "lone leading surrogate in hex escape", pending)


def _surrogate_error(text: str, what: str, esc: re.Match[str]) -> None:
    line, col = _position(text, esc.end() - 1)
    raise ArgumentsError(f"{what} at line {line} column {col}")


def _literal_end(text: str, literal: str) -> int:
    """Index of the last character of the first `literal` outside a string."""
    start = text.find(literal)
    while start >= 0 and _inside_string(text, start):
        start = text.find(literal, start + 1)
    return max(start, 0) + len(literal) - 1


def parse_arguments(text: str) -> dict[str, Any]:
    """Parse a JSON object. An empty document means `{}` (proto3 cannot tell unset)."""
    if text.strip() == "":
        return {}
    _check_depth(text)
    _check_surrogates(text)
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_parse_float,
                           parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise ArgumentsError(_serde_message(exc, text)) from None
    except _OutOfRange as exc:
        line, col = _position(text, _literal_end(text, exc.literal))
        raise ArgumentsError(f"number out of range at line {line} column {col}") from None
    except ValueError as exc:  # NaN / Infinity: not JSON
        idx = text.find(str(exc))
        line, col = _position(text, max(idx, 0))
        raise ArgumentsError(f"expected value at line {line} column {col}") from None
    except RecursionError:
        raise ArgumentsError("recursion limit exceeded at line 1 column 1") from None
    if not isinstance(value, dict):
        raise ArgumentsError(f"invalid type: {describe(value)}, expected a map")
    return value


def _inside_string(text: str, index: int) -> bool:
    for m in _STRING.finditer(text):
        if m.start() <= index < m.end():
            return True
        if m.start() > index:
            return False
    return False


def describe(value: Any) -> str:
    """serde's `Unexpected` wording for a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value!r}`"
    if isinstance(value, str):
        return f"string {json.dumps(value, ensure_ascii=False)}"
    if isinstance(value, list):
        return "sequence"
    return "map"


def dumps(value: Any) -> str:
    """Canonical JSON for outputs: compact, UTF-8, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


