"""Parse `arguments_json` the way serde_json would, with serde_json's messages.

Why: a malformed argument document is a failed step, not an RPC error, and its hint
must name line and column. Python's json module has other wording and accepts things
serde rejects (lone surrogates, NaN, unbounded nesting), so we normalise both here.
Never raises anything but ArgumentsError.
"""

from __future__ import annotations

import json
import re
from typing import Any

# serde_json's default recursion limit (serde_json::de::Deserializer::remaining_depth = 128).
MAX_DEPTH = 128

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_LONE_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")
_LONE_LOW = re.compile(r"(?<![0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


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


def parse_arguments(text: str) -> dict[str, Any]:
    """Parse a JSON object. An empty document means `{}` (proto3 cannot tell unset)."""
    if text.strip() == "":
        return {}
    _check_depth(text)
    for pattern, what in ((_LONE_HIGH, "lone leading surrogate in hex escape"),
                          (_LONE_LOW, "invalid unicode code point")):
        m = pattern.search(text)
        if m and _inside_string(text, m.start()):
            line, col = _position(text, m.end() - 1)
            raise ArgumentsError(f"{what} at line {line} column {col}")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ArgumentsError(_serde_message(exc, text)) from None
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


