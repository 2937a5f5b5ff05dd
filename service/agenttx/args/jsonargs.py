"""Parse `arguments_json` the way serde_json would, with serde_json's messages, in linear time.

Why: a malformed argument document is a failed step, not an RPC error, and its hint must
name line and column. Python's json module has other wording and accepts things serde
rejects (lone surrogates, NaN, numbers an f64 cannot hold, repeated keys, unbounded
nesting), so we normalise both here.

Every step's arguments (up to 1 MiB, SPEC §1) pass through this module on a replica that
serves other transactions, so its cost must be linear in the document for ANY input, valid
or not (SPEC §3): the happy path is CPython's C decoder, and every diagnostic (which
literal, which key, which escape, how deep, line and column) is a scan with possessive
regexes (Python >= 3.11) that neither backtracks nor restarts per position, or a C-level
string method. Patterns that could restart per position (an unterminated string full of
`\\"`, a 1e400 that also occurs inside strings) were what made the old parser quadratic.

Diagnostics follow serde's order: the error reported is the first one in the document.

Every malformed document raises ArgumentsError. Must never do I/O, and imports nothing
above it (engine, tools, store, grpc).
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate, islice
from typing import Any

__all__ = ["MAX_DEPTH", "ArgumentsError", "describe", "dumps", "json_depth", "parse_arguments"]

# serde_json's default recursion limit (serde_json::de::Deserializer, remaining_depth: 128).
# As before, a document may nest 128 levels; the 129th opener is refused.
MAX_DEPTH = 128


class ArgumentsError(Exception):
    """A serde_json-style message such as `expected value at line 1 column 1`."""


# ---- building blocks ---------------------------------------------------------------------
# Possessive quantifiers (`*+`, `++`) make every pattern below deterministic: once a piece
# has matched it is never re-tried with a shorter match, so a failed match costs what it
# read, and a scan from the start of the text reads each character a bounded number of times.

_WS = r"[ \t\n\r]*+"  # JSON whitespace
_STR = r'"(?:[^"\\]++|\\.)*+"'  # a complete string
_STR_TO_END = r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)'  # a string, or the rest of the text if unterminated
_STRING_TO_END = re.compile(_STR_TO_END, re.DOTALL)
_NON_BRACKETS = re.compile(r'[^\[\]{}]++')
_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}


def _balanced(levels: int) -> str:
    """A complete `[...]`/`{...}` group nesting at most `levels` levels (strings are atoms)."""
    group = r"[\[{](?:" + _STR + r'|[^"\[\]{}]++)*+[\]}]'
    for _ in range(levels - 1):
        group = r"[\[{](?:" + _STR + r'|[^"\[\]{}]++|' + group + r")*+[\]}]"
    return group


@dataclass(frozen=True)
class _Patterns:
    # The items of the top level: strings, anything but brackets, and complete groups; it
    # stops at a group that does not close within MAX_DEPTH levels.
    skip: re.Pattern[str]
    # One `"key": value` pair of an object, the key captured. The value, or the colon and
    # the value, may be missing (the decoder stopped there), and a string the end cuts
    # short matches without a key: so a scan never restarts inside a string.
    pair: re.Pattern[str]


def _value(group: str) -> str:
    return r"(?:" + _STR + r'|[^"\[\]{},: \t\n\r]++|' + group + r")"


@functools.cache
def _patterns() -> _Patterns:
    """Compiled on first use (~15 ms each; most documents never need them)."""
    group = _balanced(MAX_DEPTH)
    return _Patterns(
        skip=re.compile(r"(?:" + _STR + r'|[^"\[\]{}]++|' + group + r")*+", re.DOTALL),
        pair=re.compile(r"[ \t\n\r,]*+(?:(" + _STR + r")(?:" + _WS + ":" + _WS + _value(group)
                        + r'?)?|"(?:[^"\\]++|\\.)*+\\?\Z)', re.DOTALL))


@functools.lru_cache(maxsize=64)
def _counted(item: str, filler: str, n: int) -> re.Pattern[str]:
    return re.compile(r"(?:" + filler + item + r"){" + str(n) + "}" + filler, re.DOTALL)


def _end(pattern: re.Pattern[str], text: str, pos: int = 0, endpos: int | None = None) -> int:
    """Where a match of `pattern` (one that matches empty, like `(...)*+`) from `pos` ends."""
    m = pattern.match(text, pos, len(text) if endpos is None else endpos)
    assert m is not None, "the pattern matches the empty string"
    return m.end()


def _start_of_item(text: str, item: str, filler: str, n: int, start: int = 0) -> int:
    """Index where the (n+1)-th `item` after `start` begins (items inside `filler` skipped)."""
    return _end(_counted(item, filler, n), text, start)


# ---- positions ---------------------------------------------------------------------------

def _position(text: str, index: int) -> tuple[int, int]:
    """serde's line and column of the character at `index` (1-based; columns count
    characters, as Python's json does)."""
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, col


def _at(what: str, text: str, index: int) -> str:
    line, col = _position(text, index)
    return f"{what} at line {line} column {col}"


# ---- brackets ----------------------------------------------------------------------------

_BRACKET, _NOT_BRACKET = r"[\[\]{}]", r'(?:[^"\[\]{}]++|' + _STR_TO_END + r")*+"


def _brackets(text: str, start: int, end: int) -> str:
    """The brackets of text[start:end] that are outside strings, in order."""
    return _NON_BRACKETS.sub("", _STRING_TO_END.sub("", text[start:end]))


class _Profile:
    """The depth after each bracket outside strings in text[start:end]. C-level (two
    substitutions and an accumulate); built at most once per document on an error path."""

    def __init__(self, text: str, start: int, end: int) -> None:
        self.text, self.start = text, start
        self.brackets = _brackets(text, start, end)
        self.depths = list(accumulate(map(_DELTA.__getitem__, self.brackets)))

    def first_over(self, limit: int) -> int | None:
        """Index in the text of the first opener that takes the depth above `limit`."""
        if not self.depths or max(self.depths) <= limit:
            return None
        return self.position(self.depths.index(limit + 1))

    def position(self, index: int, after: int = -1, pos: int | None = None) -> int:
        """Index in the text of bracket `index`; when the earlier bracket `after` is known
        to sit at `pos`, the scan starts there."""
        start = self.start if pos is None else pos + 1
        return _start_of_item(self.text, _BRACKET, _NOT_BRACKET, index - after - 1, start)


def json_depth(text: str) -> int:
    """How many levels a JSON text nests (0 for a scalar). Linear; C-level loops."""
    if text.count("[") + text.count("{") == 0:
        return 0
    return max(_Profile(text, 0, len(text)).depths, default=0)


def _too_deep(text: str) -> int | None:
    """Index of the first opener of a valid JSON text that nests deeper than MAX_DEPTH.
    The happy path is one C-level match (complete groups within the limit); only when it
    stops early is a profile built."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return None
    pos = _end(_patterns().skip, text)
    if pos >= len(text) or text[pos] not in "[{":
        return None
    # This group is too deep (or never closes): follow its depth in chunks, so that an
    # early excess (a million `[`) stops early.
    brackets, depth, chunk = _brackets(text, pos, len(text)), 0, 1 << 14
    for off in range(0, len(brackets), chunk):
        depths = list(accumulate(map(_DELTA.__getitem__, brackets[off:off + chunk]),
                                 initial=depth))[1:]
        if max(depths) > MAX_DEPTH:
            over = off + depths.index(MAX_DEPTH + 1)
            return _start_of_item(text, _BRACKET, _NOT_BRACKET, over, pos)
        depth = depths[-1]
    return None


# ---- duplicate keys ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Open:
    kind: str  # "[" or "{"
    start: int  # just after the opener
    end: int  # where its own items end: the opener of the open child, or the target


def _open_groups(profile: _Profile, target: int) -> list[_Open]:
    """The groups still open at `target`, the end of `profile` (which starts at 0),
    outermost first. The opener of level d+1 follows the last bracket that left the depth
    at d: list.index on the reversed profile finds them all in one pass. Their positions
    come from one counted scan per level, each starting where the previous one stopped.
    Linear however deep the groups and wherever `target` is."""
    depths = profile.depths
    if not depths or depths[-1] <= 0 or min(depths) < 0:
        return []
    backwards, at = depths[::-1], 0
    openers: list[int] = []
    for level in range(depths[-1] - 1, -1, -1):
        try:
            at = backwards.index(level, at)
        except ValueError:  # level 0 before the first bracket
            openers.append(0)
            break
        openers.append(len(depths) - at)
    openers.reverse()
    starts: list[int] = []
    pos: int | None = None
    prev = -1
    for index in openers:
        pos = profile.position(index, prev, pos)
        starts.append(pos + 1)
        prev = index
    ends = [start - 1 for start in starts[1:]] + [target]
    return [_Open(profile.brackets[index], start, end)
            for index, start, end in zip(openers, starts, ends, strict=True)]


def _first_repeat(text: str, groups: list[_Open]) -> tuple[str, int] | None:
    """The first key, in document order, that repeats a key of its own object among the
    keys the open `groups` hold before their end: (key, index of its closing quote).
    Keys are read in chunks that double in size (so a repeat near the start costs little)
    and compared with C-level set operations; a Python loop runs only over the one chunk
    that holds the repeat."""
    if not groups:
        return None
    pair = _patterns().pair
    for group in groups:  # outermost first: its keys all come before the next group's
        if group.kind != "{":
            continue
        pairs, size = pair.finditer(text, group.start, group.end), 8
        seen: set[str] = set()
        while chunk := list(islice(pairs, size)):
            # one decode for the chunk: `"a"` and `"\u0061"` are the same key
            chunk = [m for m in chunk if m.group(1) is not None]  # not a cut-short string
            keys = json.loads("[" + ",".join(m.group(1) for m in chunk) + "]")
            if len(set(keys)) == len(keys) and seen.isdisjoint(keys):
                seen.update(keys)
                size = min(size * 2, 1 << 16)
                continue
            for m, key in zip(chunk, keys, strict=True):
                if key in seen:
                    return key, m.end(1) - 1
                seen.add(key)
    return None


# ---- decoding ----------------------------------------------------------------------------

class _Stop(Exception):
    """The decoder met a value serde refuses: a number out of f64 range, NaN or Infinity.
    `index` is where the token starts (for ordering), `message` carries serde's position."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


class _Watch:
    """Hooks for the C decoder: notices repeated keys and numbers out of f64 range."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.closed = 0  # objects closed so far (the C decoder calls the hook at each `}`)
        self.first_repeat: int | None = None  # ordinal (in closing order) of the first one
        self.numbers = 0

    def pairs(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        self.closed += 1
        obj = dict(pairs)
        if len(obj) != len(pairs) and self.first_repeat is None:
            self.first_repeat = self.closed
        return obj

    def _out_of_range(self, literal: str) -> _Stop:
        # The decoder calls the hooks in document order: this is the (numbers+1)-th number.
        start = _start_of_item(self.text, _NUMBER, _NOT_NUMBER, self.numbers)
        return _Stop(start, _at("number out of range", self.text, start + len(literal) - 1))

    def parse_int(self, literal: str) -> int:
        digits = len(literal) - literal.startswith("-")
        # 10**309 > f64::MAX: serde cannot hold it (and int() would refuse > 4300 digits).
        if digits > 309 or (digits == 309 and not math.isfinite(float(literal))):
            raise self._out_of_range(literal)
        self.numbers += 1
        return int(literal)

    def parse_float(self, literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise self._out_of_range(literal)
        self.numbers += 1
        return value

    def parse_constant(self, name: str) -> Any:
        # NaN, Infinity, -Infinity: not JSON. The first one outside strings is this one.
        start = _end(_BEFORE_CONSTANT, self.text)
        raise _Stop(start, _at("expected value", self.text, start))


_NUMBER = r"-?[0-9][0-9.eE+-]*+"
_NOT_NUMBER = r'(?:[^"0-9-]++|' + _STR + r")*+"
_BEFORE_CONSTANT = re.compile(r'(?:[^"NI-]++|' + _STR + r"|-(?!Infinity)|N(?!aN)|I(?!nfinity))*+",
                              re.DOTALL)
# An f64 overflows only if integer digits + exponent >= 309: with an exponent of 3+ digits
# or a run of 209+ digits. Only then do numbers go through Python hooks (a hook per number
# costs 3x the C decoder).
_BIG_EXPONENT = re.compile(r"[eE]\+?0*+[1-9][0-9]{2}")  # two searches beat one alternation
_LONG_DIGITS = re.compile(r"(?<![0-9])[0-9]{209}")  # tried once per run of digits
# Both match runs of these characters only, so a slice that ends where such a run ends
# cuts no match in two.
_NUMBER_RUN = re.compile(r"[0-9eE+]*+")
# How much of the text one regex search reads at a time. A search holds the GIL for its
# whole call; a large document is parsed on a worker thread so that the event loop runs
# beside it (engine/arguments.py), which it can only do between such calls. 64 Ki
# characters take about a millisecond; the whole 1 MiB took 20-60 ms in one call.
_SLICE = 1 << 16


def _big_numbers(text: str) -> bool:
    start = 0
    while start < len(text):
        end = _end(_NUMBER_RUN, text, min(start + _SLICE, len(text)))
        if _BIG_EXPONENT.search(text, start, end) or _LONG_DIGITS.search(text, start, end):
            return True
        start = end
    return False
# Escapes of UTF-16 surrogates that do not form a pair. Everything else, including valid
# pairs and `\\` (so `\\ud800` is text), is skipped in one possessive pass; outside strings
# a valid JSON prefix has no backslashes.
_HIGH, _LOW = r"[dD][89abAB][0-9a-fA-F]{2}", r"[dD][c-fC-F][0-9a-fA-F]{2}"
_GOOD_ESCAPES = re.compile(r"(?:[^\\]++|\\[^u]|\\u(?![dD][89a-fA-F])|\\u" + _HIGH + r"\\u" + _LOW
                           + r")*+", re.DOTALL)
_BAD_HIGH = re.compile(r"\\u" + _HIGH)
_BAD_LOW = re.compile(r"\\u" + _LOW)


def _first_bad_surrogate(text: str, limit: int) -> tuple[int, str] | None:
    if "\\u" not in text:
        return None
    pos = _end(_GOOD_ESCAPES, text)
    if pos >= limit:
        return None
    if _BAD_HIGH.match(text, pos):
        return pos + 5, _at("lone leading surrogate in hex escape", text, pos + 5)
    if _BAD_LOW.match(text, pos):
        return pos + 5, _at("invalid unicode code point", text, pos + 5)
    return None  # a lone backslash at the very end: the decoder's error


def _serde_message(exc: json.JSONDecodeError, text: str, innermost: str) -> str:
    msg, pos = exc.msg, exc.pos
    line, col = exc.lineno, exc.colno
    at_end = pos >= len(text.rstrip())

    def eof(kind: str) -> str:
        return f"EOF while parsing {kind} at line {line} column {max(col - 1, 0)}"

    def trailing_comma() -> bool:  # serde: `[1,]` and `{"a":1,}` are "trailing comma"
        return pos < len(text) and text[pos] in "]}" and text[:pos].rstrip(" \t\n\r").endswith(",")

    if msg.startswith("Expecting value"):
        if at_end:
            return eof("a value")
        if trailing_comma():
            return f"trailing comma at line {line} column {col}"
        return f"expected value at line {line} column {col}"
    if msg.startswith("Expecting property name"):
        if at_end:
            return eof("an object")
        if trailing_comma():
            return f"trailing comma at line {line} column {col}"
        return f"key must be a string at line {line} column {col}"
    if msg.startswith("Expecting ':'"):
        if at_end:
            return eof("an object")
        return f"expected `:` at line {line} column {col}"
    if msg.startswith("Expecting ',' delimiter"):
        kind, close = ("an object", "}") if innermost == "{" else ("a list", "]")
        if at_end:
            return eof(kind)
        return f"expected `,` or `{close}` at line {line} column {col}"
    if msg.startswith("Extra data"):
        return f"trailing characters at line {line} column {col}"
    if msg.startswith("Unterminated string"):
        eline, ecol = _position(text, len(text))
        return f"EOF while parsing a string at line {eline} column {max(ecol - 1, 0)}"
    if msg.startswith("Invalid control character"):
        return f"control character (\\u0000-\\u001F) found while parsing a string at line {line} column {col}"
    if msg.startswith(("Invalid \\uXXXX escape", "Invalid \\escape")):
        return f"invalid escape at line {line} column {col}"
    if msg.startswith("Unexpected UTF-8 BOM"):  # serde: a BOM is not whitespace
        return f"expected value at line {line} column {col}"
    if msg.startswith("Illegal trailing comma"):  # Python >= 3.13
        return f"trailing comma at line {line} column {col}"
    return f"{msg[0].lower() + msg[1:]} at line {line} column {col}"


def _decode(text: str, big_numbers: bool) -> tuple[Any, _Watch, Exception | None]:
    """Run the C decoder: the value, the hooks' notes, and the decoder's error
    (JSONDecodeError, _Stop, or RecursionError for nesting beyond what CPython allows)."""
    watch = _Watch(text)
    hooks: dict[str, Any] = {"object_pairs_hook": watch.pairs, "parse_constant": watch.parse_constant}
    if big_numbers:
        hooks.update(parse_int=watch.parse_int, parse_float=watch.parse_float)
    try:
        return json.loads(text, **hooks), watch, None
    except (json.JSONDecodeError, _Stop, RecursionError) as exc:
        return None, watch, exc
    except ValueError:  # an integer beyond int()'s digit limit the gate did not foresee
        if big_numbers:
            raise
        return _decode(text, True)


def parse_arguments(text: str) -> dict[str, Any]:
    """Parse a JSON object. An empty document means `{}` (proto3 cannot tell unset)."""
    if text.strip() == "":
        return {}
    value = _parse(text)
    if not isinstance(value, dict):
        raise ArgumentsError(f"invalid type: {describe(value)}, expected a map")
    return value


def _parse(text: str) -> Any:
    """Decode, then report the first error in the document: the decoder's (syntax, NaN,
    a number out of range), nesting beyond MAX_DEPTH, a repeated key, a lone surrogate."""
    value, watch, error = _decode(text, _big_numbers(text))
    candidates: list[tuple[int, str]] = []  # (index for serde's order, message)
    limit = len(text)  # escapes before this index are checked for lone surrogates
    stop: int | None = None  # where the decoder stopped: text[:stop] is a valid prefix
    if isinstance(error, _Stop):
        stop = limit = error.index
        candidates.append((error.index, error.message))
    elif isinstance(error, json.JSONDecodeError):
        stop = error.pos
        # serde reads the escapes of an unterminated string up to the end
        limit = len(text) if error.msg.startswith("Unterminated string") else error.pos
    if stop is not None:
        profile = _Profile(text, 0, stop)
        deep = profile.first_over(MAX_DEPTH)
        groups = _open_groups(profile, stop)
        if isinstance(error, json.JSONDecodeError):
            innermost = groups[-1].kind if groups else "{"
            candidates.append((limit, _serde_message(error, text, innermost)))
    else:  # decoded, or nested deeper than CPython allows (far beyond MAX_DEPTH)
        deep = _too_deep(text)
        groups = []
        if deep is not None and error is not None:  # objects the decoder never closed
            groups = _open_groups(_Profile(text, 0, deep), deep)
    if deep is None and isinstance(error, RecursionError):  # cannot happen: a guard
        deep = 0
    if deep is not None:
        candidates.append((deep, _at("recursion limit exceeded", text, deep)))
    repeat = _first_repeat(text, groups)  # in an object still open where decoding stopped
    if repeat is not None:
        candidates.append(_duplicate(text, repeat))
    if watch.first_repeat is not None:  # in the first object the decoder closed with one
        close = _start_of_item(text, r"\}", r'(?:[^"}]++|' + _STR + r")*+", watch.first_repeat - 1)
        repeat = _first_repeat(text, _open_groups(_Profile(text, 0, close), close))
        if repeat is not None:
            candidates.append(_duplicate(text, repeat))
    bad = _first_bad_surrogate(text, min(limit, len(text) if deep is None else deep))
    if bad is not None:
        candidates.append(bad)
    if candidates:
        raise ArgumentsError(min(candidates)[1])
    return value


_UNPRINTABLE_KEY = re.compile(r"[\x00-\x1f\x7f`\x85\u2028\u2029]")


def _duplicate(text: str, repeat: tuple[str, int]) -> tuple[int, str]:
    key, quote = repeat  # serde reports it at the key's closing quote
    if _UNPRINTABLE_KEY.search(key):  # keep the message one line with one `...` pair
        key = json.dumps(key, ensure_ascii=False)[1:-1].replace("`", "\\u0060")
    return quote, _at(f"duplicate field `{key}`", text, quote)


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
