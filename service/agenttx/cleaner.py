"""Raw tool error text -> PostgreSQL condition name + a one-line hint an agent can act on.

Why this exists: an LLM agent recovers from a failed step far better when it is told in
one line *what* is wrong (the concrete table, key, id, field, path, line and column) and
*what to do next* than when it is handed a driver message or a traceback. Categories are
PostgreSQL condition names (SQLSTATE class names, SPEC §4) so that people reading
`error_category` already know them; the rollback planner keys its strategy on them.

The cleaner is a classifier over message TEXT, not a side channel from the built-in tools:
a custom tool that raises ``duplicate key value violates unique constraint "x_pkey"`` gets
exactly the category, hint and subject the built-in gets. Rules live in one ordered table,
most specific first. Each rule is tried anchored at the start of the message (and after
leading prefixes such as ``ERROR:  ``, ``FileNotFoundError: `` or an argument path
``fields.x: ``); only if none matches there is each rule searched for anywhere in the
message, and the earliest match wins. Anchoring first keeps user data that happens to look
like another message (a kv key spelled "permission denied") from hijacking the category.
Nothing matches -> ``internal_error`` with the message's first line.

One exception to "text only": a tool that knows its failure's category for certain (a
toolset's upstream answered `isError`, or could not be reached: `fdw_error`,
`fdw_unable_to_establish_connection`, docs/toolsets.md) passes it along
(`ToolError(category=...)`), and the cleaner then only makes the message a hint: one line,
at most 200 characters. Parsing that category back out of prose would be guesswork about
someone else's wording.

This module must never do I/O, never import grpc, etcd or engine code, and never raise:
any input gives a result whose hint is a single line of at most 200 characters.
"""

from __future__ import annotations

import difflib
import json
import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["CATEGORIES", "EMPTY_MESSAGE_HINT", "HINT_MAX_CHARS", "CleanedError", "clean_error"]

HINT_MAX_CHARS = 200
# The API caps arguments_json and raw_context at 1 MiB (SPEC §1) and messages echo argument
# values, so a message up to that size is classified whole; beyond it only its head is read.
SCAN_LIMIT_CHARS = 2 * 1024 * 1024

CATEGORIES = frozenset({
    "unique_violation", "not_null_violation", "foreign_key_violation", "no_data_found",
    "undefined_file", "invalid_text_representation", "invalid_parameter_value",
    "invalid_name", "undefined_function", "undefined_object", "undefined_column",
    "lock_not_available", "insufficient_privilege", "program_limit_exceeded",
    "fdw_error", "fdw_unable_to_establish_connection", "internal_error",
})

EMPTY_MESSAGE_HINT = "The tool failed without a message; retry or change the arguments."


@dataclass(frozen=True)
class CleanedError:
    """What the engine records for a failed step."""

    category: str  # a PostgreSQL condition name, one of CATEGORIES
    hint: str  # one line, <= HINT_MAX_CHARS, names the concrete thing and what to do
    # extracted pieces; keys among: table, column, value, ref_table, key, id, path, tool,
    # step, channel, field, line, column_no
    subject: Mapping[str, str]


def clean_error(raw: str, *, known_tools: Iterable[str] = (),
                category: str | None = None) -> CleanedError:
    """Classify `raw` (any error text) and build the agent-facing hint. Never raises.

    `category`, when the tool states it (one of CATEGORIES), is kept as is: when the text
    is worded the way a rule of that same category knows, that rule still builds the hint
    (with the values and what to do); otherwise the hint is `raw` made one line of at most
    HINT_MAX_CHARS. Without a category, the text is classified."""
    try:
        text = _normalize(raw)
        if category is not None and category in CATEGORIES and category != "internal_error":
            known = _classify(text, _tool_names(known_tools)) if text else None
            if known is not None and known.category == category:
                return known
            hint = _shorten(_collapse(text), HINT_MAX_CHARS)
            return CleanedError(category, hint or EMPTY_MESSAGE_HINT, {})
        if not text:
            return CleanedError("internal_error", EMPTY_MESSAGE_HINT, {})
        return _classify(text, _tool_names(known_tools)) or _internal(text)
    except Exception:  # the contract is "never raise": the engine must always get a result
        return CleanedError("internal_error", EMPTY_MESSAGE_HINT, {})


# ---- rendering ---------------------------------------------------------------------------

_MIN_SHOWN = 8  # a value is never shortened below this many characters (plus "…")
_WHITESPACE = re.compile(r"\s+")
_NUMBER = re.compile(r"-?\d+")
# Characters str.splitlines() breaks on that json.dumps(ensure_ascii=False) leaves as-is.
_LINE_BREAK_ESCAPES = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
# Everything str.splitlines() breaks on; a last safety net for the one-line guarantee.
_LINE_BREAKS_TO_SPACE = str.maketrans(
    dict.fromkeys("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", " "))


def _quote(text: str) -> str:
    """A value as a JSON string literal: double-quoted, escaped, always one line."""
    return json.dumps(text, ensure_ascii=False).translate(_LINE_BREAK_ESCAPES)


def _collapse(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


class _HintFormatter(string.Formatter):
    """``{x!q}`` inserts x quoted, ``{x!n}`` bare when it is an integer else quoted, and a
    plain ``{x}`` whitespace-collapsed."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        text = str(value)
        if conversion == "q":
            return _quote(text)
        if conversion == "n":
            return text if _NUMBER.fullmatch(text) else _quote(text)
        return _collapse(text)


_FORMATTER = _HintFormatter()


def _render(template: str, values: Mapping[str, str]) -> str:
    """Fill `template`; while too long, shorten the longest value (with "…") rather than
    cutting the instruction at the end off."""
    used = {name for _, name, _, _ in _FORMATTER.parse(template) if name}
    values = {name: value for name, value in values.items() if name in used}
    limits = {name: len(value) for name, value in values.items()}
    while True:
        shown = {name: _shorten(value, limits[name]) for name, value in values.items()}
        hint = _FORMATTER.format(template, **shown).translate(_LINE_BREAKS_TO_SPACE).strip()
        excess = len(hint) - HINT_MAX_CHARS
        if excess <= 0:
            return hint
        longest = max(limits, key=limits.__getitem__, default=None)
        if longest is None or limits[longest] <= _MIN_SHOWN:
            return _shorten(hint, HINT_MAX_CHARS)
        limits[longest] = max(_MIN_SHOWN, limits[longest] - excess)


# ---- input -------------------------------------------------------------------------------

def _normalize(raw: object) -> str:
    text = raw if isinstance(raw, str) else ("" if raw is None else str(raw))
    text = text[:SCAN_LIMIT_CHARS]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (e.g. surrogateescape'd file names)
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def _tool_names(known_tools: Iterable[str]) -> tuple[str, ...]:
    try:
        names = [t for t in known_tools if isinstance(t, str) and t.strip()]
    except Exception:  # an iterable that fails must not cost the agent its hint
        names = []
    return tuple(dict.fromkeys(names))


# ---- matching ----------------------------------------------------------------------------

class _Hint(NamedTuple):
    template: str
    values: Mapping[str, str]
    subject: Mapping[str, str | None]
    category: str | None = None  # overrides the rule's category


@dataclass(frozen=True)
class _Ctx:
    arg_path: str | None  # "fields.customer_id" when the message was prefixed with it
    known_tools: tuple[str, ...]


@dataclass(frozen=True)
class _Rule:
    category: str
    # lowercase ASCII literals a match begins with (after any optional prefix such as
    # `[Errno 2] `): the search pass only tries the pattern where one of them occurs
    keywords: tuple[str, ...]
    pattern: re.Pattern[str]
    build: Callable[[re.Match[str], _Ctx], _Hint]


_CANDIDATES = 16
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# `ERROR:  `, `ValueError: `, `fields.customer_id: ` ... before the message proper.
_LEADING = re.compile(r"[^\s:'\"`]{1,200}:[ \t]+")
_ARG_PATH_BEFORE = re.compile(
    r"(?:^|(?<=[\s:]))(?P<path>(?:[^\W\d]|\$)[\w$-]*(?:\.[\w$-]+|\[\d+\])*):[ \t]+\Z")
# ... but an exception class or a severity word is not an argument path.
_NOT_ARG_PATH = re.compile(
    r"(?:.*\.)?(?:[A-Z]\w*(?:Error|Exception|Warning|Violation|Failure|Fault)|[A-Z0-9_]+"
    r"|(?i:error|warning|fatal|panic|detail|hint|context|notice|info|debug|exception|failed"
    r"|failure))")


def _starts(text: str) -> list[int]:
    starts, pos = [0], 0
    for _ in range(4):
        m = _LEADING.match(text, pos)
        if m is None:
            break
        pos = m.end()
        starts.append(pos)
    return starts


def _arg_path_before(text: str, start: int, tools: tuple[str, ...]) -> str | None:
    m = _ARG_PATH_BEFORE.search(text[max(0, start - 300):start])
    if m is None:
        return None
    path = m.group("path")
    if path in tools or _NOT_ARG_PATH.fullmatch(path):
        return None
    return path


def _classify(text: str, tools: tuple[str, ...]) -> CleanedError | None:
    # Pass 1: anchored at the start, or right after a leading prefix.
    for start in _starts(text):
        for rule in _RULES:
            m = rule.pattern.match(text, start)
            if m is not None:
                return _finish(rule, m, text, tools)
    # Pass 2: anywhere; the earliest match wins, ties go to the earlier rule. Each rule is
    # only tried where its keywords occur (at most _CANDIDATES places each), which keeps a
    # huge or adversarial message from costing more than a few linear scans.
    lowered = text.translate(_ASCII_LOWER)
    best: tuple[re.Match[str], _Rule] | None = None
    for rule in _RULES:
        limit = len(text) if best is None else best[0].start() - 1
        for start in _keyword_positions(lowered, rule.keywords, limit):
            m = rule.pattern.match(text, start)
            if m is not None:
                best = (m, rule)
                break
    return None if best is None else _finish(best[1], best[0], text, tools)


def _keyword_positions(lowered: str, keywords: tuple[str, ...], limit: int) -> list[int]:
    """Sorted start positions (< limit) of the first _CANDIDATES hits of each keyword."""
    found: set[int] = set()
    for word in keywords:
        end = limit + len(word)
        pos = lowered.find(word, 0, end)
        for _ in range(_CANDIDATES):
            if pos < 0:
                break
            found.add(pos)
            pos = lowered.find(word, pos + 1, end)
    return sorted(found)


def _finish(rule: _Rule, m: re.Match[str], text: str, tools: tuple[str, ...]) -> CleanedError:
    arg_path = _arg_path_before(text, m.start(), tools)
    built = rule.build(m, _Ctx(arg_path, tools))
    category = built.category or rule.category
    subject = {k: v for k, v in built.subject.items() if v is not None}
    if category == "invalid_parameter_value" and arg_path and "field" not in subject:
        subject["field"] = arg_path
    return CleanedError(category, _render(built.template, built.values), subject)


def _internal(text: str) -> CleanedError:
    first = text.partition("\n")[0]  # `text` is stripped, so this line is not blank
    hint = _shorten(_collapse(first), HINT_MAX_CHARS)
    return CleanedError("internal_error", hint or EMPTY_MESSAGE_HINT, {})


# ---- small helpers for the builders ------------------------------------------------------

def _g(m: re.Match[str], *names: str) -> str | None:
    """The first of the named groups that the pattern has and that took part in the match."""
    for name in names:
        if name in m.re.groupindex:
            value = m.group(name)
            if value is not None:
                return value
    return None


# serde's ` at line 1 column 9` suffix on data errors.
_POSITION_SUFFIX = re.compile(r"(?P<text>.*?)(?: at line (?P<line>\d+) column (?P<column>\d+))?"
                              r"[ \t.]*", re.DOTALL)


def _split_position(text: str) -> tuple[str, dict[str, str | None]]:
    m = _POSITION_SUFFIX.fullmatch(text)
    if m is None:  # unreachable: the pattern matches any text
        return text, {}
    return m.group("text"), {"line": m.group("line"), "column_no": m.group("column")}


_BACKTICKED = re.compile(r"`([^`]*)`")


def _unbacktick(text: str) -> str:
    """serde's ``integer `5` `` -> ``integer 5``."""
    return _BACKTICKED.sub(r"\1", text)


def _backticks_to_quotes(text: str) -> str:
    """serde's ``expected `,` or `}` `` -> ``expected "," or "}"``."""
    return _BACKTICKED.sub(lambda m: _quote(m.group(1)), text)


def _quoted_list(names: Iterable[str], conjunction: str = ", ", budget: int = 100) -> str:
    """``"a", "b" or "c"`` (conjunction " or ") / ``"a", "b", "c"``; at most `budget`
    characters, whole names only (at least one)."""
    quoted: list[str] = []
    for name in names:
        q = _quote(_shorten(_collapse(name), 40))
        if quoted and sum(len(x) + 2 for x in quoted) + len(q) > budget:
            break
        quoted.append(q)
    if len(quoted) < 2:
        return "".join(quoted)
    return ", ".join(quoted[:-1]) + conjunction + quoted[-1]


def _field(ctx: _Ctx, name: str | None = None) -> str | None:
    if name is None:
        return ctx.arg_path
    return f"{ctx.arg_path}.{name}" if ctx.arg_path else name


# ---- builders, one per kind of message ---------------------------------------------------

_SMALLER = "make this step smaller, or commit and continue in a new transaction."


def _limit(m: re.Match[str], ctx: _Ctx) -> _Hint:
    detail = (m.group("detail") or "").strip().rstrip(".;")
    if detail:
        return _Hint("Limit exceeded: {detail}; " + _SMALLER, {"detail": detail}, {})
    return _Hint("A limit was exceeded; " + _SMALLER, {}, {})


_WAIT = "wait for it to commit or roll back"


def _lock_row(m: re.Match[str], ctx: _Ctx) -> _Hint:
    table, path = m.group("table"), m.group("path")
    subject = {"table": table, "path": path}
    if path is not None:
        return _Hint("Path {path!q} is locked by another transaction; " + _WAIT
                     + ", or write a different path.", {"path": path}, subject)
    if table == "fs":
        return _Hint("A path in fs is locked by another transaction; " + _WAIT
                     + ", or write a different path.", {}, subject)
    return _Hint("Table {table!q} is locked by another transaction; " + _WAIT
                 + ", then retry.", {"table": table}, subject)


def _lock_other(m: re.Match[str], ctx: _Ctx) -> _Hint:
    return _Hint("Another transaction holds a conflicting lock; " + _WAIT
                 + ", then retry this step.", {}, {})


def _unique(m: re.Match[str], ctx: _Ctx) -> _Hint:
    constraint, column, value = m.group("constraint"), m.group("column"), m.group("value")
    table: str | None = None
    if constraint.lower().endswith("_pkey") and len(constraint) > 5:
        table = constraint[:-5]
    elif column:
        suffix = "_" + "_".join(c.strip() for c in column.split(",")) + "_key"
        if constraint.endswith(suffix) and len(constraint) > len(suffix):
            table = constraint[: -len(suffix)]
    subject = {"table": table, "column": column, "value": value,
               "id": value if column == "id" else None}
    values = {"table": table or "", "column": column or "", "value": value or "",
              "constraint": constraint}
    if value is not None and column == "id" and table:
        template = ("Id {value!q} already exists in table {table!q}; "
                    "use a new id, or record.get the existing row instead.")
    elif value is not None and table:
        template = ("Value {value!q} of column {column!q} already exists in table {table!q}; "
                    "use a different value.")
    elif value is not None:
        template = ("Value {value!q} of column {column!q} already exists "
                    "(constraint {constraint!q}); use a different value.")
    elif table:
        template = ("A row with this id already exists in table {table!q}; "
                    "use a new id, or record.get the existing row instead.")
    else:
        template = "A value violates unique constraint {constraint!q}; use a different value."
    return _Hint(template, values, subject)


def _fk_insert(m: re.Match[str], ctx: _Ctx) -> _Hint:
    table, constraint = m.group("table"), m.group("constraint")
    column, value, ref_table = m.group("column"), m.group("value"), m.group("ref_table")
    if column is None and constraint.startswith(table + "_") and constraint.endswith("_fkey"):
        column = constraint[len(table) + 1: -len("_fkey")] or None
    subject = {"table": table, "column": column, "value": value, "ref_table": ref_table}
    values = {"table": table, "column": column or "", "value": value or "",
              "ref_table": ref_table or "", "constraint": constraint}
    fix = "insert that row first or use an existing id."
    if value is not None and column is not None:
        template = ("Field {column!q} of table {table!q} references {value!q}, which is not in "
                    "table {ref_table!q}; " + fix)
    elif column is not None:
        template = ("Field {column!q} of table {table!q} references a row that does not exist; "
                    + fix)
    else:
        template = ("A foreign key of table {table!q} (constraint {constraint!q}) references a "
                    "row that does not exist; " + fix)
    return _Hint(template, values, subject)


def _fk_delete(m: re.Match[str], ctx: _Ctx) -> _Hint:
    table, constraint = m.group("table"), m.group("constraint")
    column, value = m.group("column"), m.group("value")
    ref_table = _g(m, "referencing", "ref_table")
    subject = {"table": table, "column": column, "value": value, "ref_table": ref_table}
    values = {"table": table, "value": value or "", "ref_table": ref_table or "",
              "constraint": constraint}
    fix = "delete or change the referencing rows first."
    if value is not None and ref_table is not None:
        template = ("Row {value!q} of table {table!q} is still referenced from table "
                    "{ref_table!q}; " + fix)
    else:
        template = ("A row of table {table!q} is still referenced (constraint {constraint!q}); "
                    + fix)
    return _Hint(template, values, subject)


def _not_null(m: re.Match[str], ctx: _Ctx) -> _Hint:
    column, table = m.group("column"), m.group("table")
    subject = {"column": column, "table": table}
    if table is not None:
        return _Hint("Field {column!q} of table {table!q} must not be null; "
                     "set it to a non-null value.", {"column": column, "table": table}, subject)
    return _Hint("Field {column!q} must not be null; set it to a non-null value.",
                 {"column": column}, subject)


def _no_row(m: re.Match[str], ctx: _Ctx) -> _Hint:
    column, value = m.group("col"), m.group("val")
    table = _g(m, "table", "table_bare") or ""
    if column.lower() == "key":
        subject = {"key": value, "table": table}
        if table == "kv":
            return _Hint("Key {key!q} does not exist in kv; kv.put it first or read an "
                         "existing key.", {"key": value}, subject)
        return _Hint("Key {key!q} does not exist in table {table!q}; write it first or read an "
                     "existing key.", {"key": value, "table": table}, subject)
    if column.lower() == "id":
        return _Hint("No row with id {id!q} in table {table!q}; record.insert it first or use "
                     "an existing id.", {"id": value, "table": table},
                     {"id": value, "table": table})
    return _Hint("No row with {column}={value!q} in table {table!q}; create it first or use an "
                 "existing value.", {"column": column, "value": value, "table": table},
                 {"column": column, "value": value, "table": table})


def _no_rows(m: re.Match[str], ctx: _Ctx) -> _Hint:
    return _Hint("The lookup returned no rows; check the key or id, or create the row first.",
                 {}, {})


def _step_output(m: re.Match[str], ctx: _Ctx) -> _Hint:
    column, step = m.group("column"), m.group("step")
    return _Hint("Path {column!q} does not exist in the output of step {step!n}; reference a "
                 "field that step {step!n} returned.", {"column": column, "step": step},
                 {"column": column, "step": step})


def _column(m: re.Match[str], ctx: _Ctx) -> _Hint:
    column, table = m.group("column"), m.group("table")
    if table is not None:
        return _Hint("Column {column!q} does not exist in table {table!q}; use an existing "
                     "column.", {"column": column, "table": table},
                     {"column": column, "table": table})
    return _Hint("Column {column!q} does not exist; use an existing column.",
                 {"column": column}, {"column": column})


_REFERENCED_AS = re.compile(r"referenced as (?P<ref>[^)\n]*)\)")
_LIVE_STEPS = re.compile(r"live steps:[ \t]*(?P<live>[^\n;]*)")


def _step(m: re.Match[str], ctx: _Ctx) -> _Hint:
    step = _g(m, "step", "step_bare") or ""
    rest = m.group("rest") or ""
    ref, live = _REFERENCED_AS.search(rest), _LIVE_STEPS.search(rest)
    values = {"step": step}
    if ref is not None:
        values["ref"] = ref.group("ref").strip()
        lead = "{ref} refers to step {step!n}, which is not live"
    else:
        lead = "Step {step!n} is not live"
    live_steps = live.group("live").strip().rstrip(".") if live is not None else None
    if live_steps and live_steps.lower() != "none":
        values["live"] = live_steps
        tail = "; reference one of the live steps: {live}."
    elif live_steps is not None:
        tail = "; no step is live now, so remove the reference."
    else:
        tail = "; reference a live step (one applied and not undone)."
    return _Hint(lead + tail, values, {"step": step})


def _channel(m: re.Match[str], ctx: _Ctx) -> _Hint:
    channel = _g(m, "channel", "channel_bare") or ""
    configured = [c.strip() for c in (m.group("channels") or "").split(",") if c.strip()]
    if configured:
        return _Hint("Effect channel {channel!q} does not exist; use one of the configured "
                     "channels: {channels}.",
                     {"channel": channel, "channels": _quoted_list(configured)},
                     {"channel": channel})
    return _Hint("Effect channel {channel!q} does not exist; use a configured channel.",
                 {"channel": channel}, {"channel": channel})


def _named_object(m: re.Match[str], ctx: _Ctx) -> _Hint:
    kind, name = m.group("kind").lower(), m.group("name")
    if kind in ("relation", "table", "view"):
        return _Hint("Table {table!q} does not exist; use an existing table.",
                     {"table": name}, {"table": name})
    return _Hint(kind.capitalize() + " {name!q} does not exist; use an existing " + kind + ".",
                 {"name": name}, {})


def _closest_tools(name: str, known: tuple[str, ...]) -> list[str]:
    """Up to 3 known tools that look like `name`, best first (difflib ratio, also with
    punctuation removed so `recordinsert` finds `record.insert`)."""
    def squash(s: str) -> str:
        return re.sub(r"[\W_]+", "", s)

    wanted = name.casefold()[:256]
    scored: list[tuple[float, str]] = []
    for tool in known:
        if tool == name:
            continue
        cand = tool.casefold()[:256]
        score = max(difflib.SequenceMatcher(None, wanted, cand).ratio(),
                    difflib.SequenceMatcher(None, squash(wanted), squash(cand)).ratio())
        if score >= 0.6:
            scored.append((-score, tool))
    scored.sort()
    if not scored:
        return []
    best = -scored[0][0]
    return [tool for neg, tool in scored[:3] if -neg >= best - 0.1]


def _function(m: re.Match[str], ctx: _Ctx) -> _Hint:
    tool = _g(m, "tool", "tool_q", "tool_s", "tool_bare") or ""
    subject = {"tool": tool}
    close = _closest_tools(tool, ctx.known_tools)
    if close:
        return _Hint("Tool {tool!q} does not exist; did you mean {close}? Use one of the "
                     "registered tools.", {"tool": tool, "close": _quoted_list(close, " or ")},
                     subject)
    if ctx.known_tools:
        return _Hint("Tool {tool!q} does not exist; use a registered tool, e.g. {examples}.",
                     {"tool": tool, "examples": _quoted_list(sorted(ctx.known_tools)[:5])},
                     subject)
    return _Hint("Tool {tool!q} does not exist; use one of the registered tools.",
                 {"tool": tool}, subject)


def _invalid_name(m: re.Match[str], ctx: _Ctx) -> _Hint:
    kind, name = _g(m, "kind"), _g(m, "name", "name2")
    pattern = (_g(m, "pattern") or "").strip().rstrip(".;")
    if name is None or kind is None:
        return _Hint("A name is invalid; use only letters, digits and underscores.", {}, {})
    subject = {"table": name} if kind.lower() == "table" else {}
    label = kind.capitalize() + " name {name!q} is invalid; "
    if pattern:
        return _Hint(label + "rename it to match {pattern}.",
                     {"name": name, "pattern": pattern}, subject)
    return _Hint(label + "use only letters, digits and underscores.", {"name": name}, subject)


def _sandbox(m: re.Match[str], ctx: _Ctx) -> _Hint:
    path, reason = m.group("path"), (m.group("reason") or "").strip().rstrip(".")
    subject = {"path": path}
    if "outside the sandbox" in reason.lower():
        return _Hint("Path {path!q} resolves outside the sandbox; use a relative path inside it "
                     "(no \"..\", no absolute path, no symlink out).", {"path": path}, subject)
    if reason:
        return _Hint("Permission denied for path {path!q} ({reason}); use a different path.",
                     {"path": path, "reason": reason}, subject)
    return _Hint("Permission denied for path {path!q}; use a different path inside the sandbox.",
                 {"path": path}, subject)


def _posix_permission(m: re.Match[str], ctx: _Ctx) -> _Hint:
    path = m.group("path")
    if path is None:
        return _Hint("Permission denied; use a path or resource you are allowed to access.",
                     {}, {})
    return _Hint("Permission denied for path {path!q}; use a different path inside the sandbox.",
                 {"path": path}, {"path": path})


def _pg_permission(m: re.Match[str], ctx: _Ctx) -> _Hint:
    kind, name = m.group("kind").lower(), m.group("name").strip("\"'")
    subject = {"table": name} if kind in ("table", "relation", "view") else {}
    label = "table" if kind == "relation" else kind
    return _Hint("Permission denied for " + label + " {name!q}; use a " + label
                 + " you are allowed to access.", {"name": name}, subject)


def _no_file(m: re.Match[str], ctx: _Ctx) -> _Hint:
    path = _g(m, "path")
    if path is None:
        return _Hint("The file does not exist; check the path, or fs.write it first.", {}, {})
    return _Hint("File {path!q} does not exist; fs.write it first or read an existing path.",
                 {"path": path}, {"path": path})


def _is_dir(m: re.Match[str], ctx: _Ctx) -> _Hint:
    path = m.group("path")
    if path is None:
        return _Hint("The path is a directory; use the path of a file inside it.", {}, {})
    return _Hint("Path {path!q} is a directory; use the path of a file inside it.",
                 {"path": path}, {"path": path})


def _not_dir(m: re.Match[str], ctx: _Ctx) -> _Hint:
    path = m.group("path")
    if path is None:
        return _Hint("A parent of the path is a file, not a directory; use a different path.",
                     {}, {})
    return _Hint("A parent of path {path!q} is a file, not a directory; use a different path.",
                 {"path": path}, {"path": path})


def _missing(m: re.Match[str], ctx: _Ctx) -> _Hint:
    field = _field(ctx, m.group("name")) or ""
    _, position = _split_position(m.group("rest"))
    return _Hint("Argument {field!q} is missing; add it to arguments_json.", {"field": field},
                 {"field": field, **position})


def _unknown_field(m: re.Match[str], ctx: _Ctx) -> _Hint:
    field = _field(ctx, m.group("name")) or ""
    expected, position = _split_position(m.group("rest"))
    subject = {"field": field, **position}
    allowed = _BACKTICKED.findall(expected)
    if allowed:
        return _Hint("Argument {field!q} is not accepted; use only {allowed}.",
                     {"field": field, "allowed": _quoted_list(allowed, budget=120)}, subject)
    return _Hint("Argument {field!q} is not accepted; remove it (no arguments are expected "
                 "there).", {"field": field}, subject)


def _duplicate_field(m: re.Match[str], ctx: _Ctx) -> _Hint:
    field = _field(ctx, m.group("name")) or ""
    _, position = _split_position(m.group("rest"))
    return _Hint("Argument {field!q} is given more than once; send it once.", {"field": field},
                 {"field": field, **position})


def _unknown_variant(m: re.Match[str], ctx: _Ctx) -> _Hint:
    value, field = m.group("value"), _field(ctx)
    expected, position = _split_position(m.group("rest"))
    allowed = _BACKTICKED.findall(expected)
    values = {"value": value, "field": field or "", "allowed": _quoted_list(allowed, budget=120)}
    where = " for {field!q}" if field else ""
    fix = "; use one of {allowed}." if allowed else "; use a supported value."
    return _Hint("Value {value!q} is not accepted" + where + fix, values,
                 {"value": value, "field": field, **position})


_TOP_LEVEL = re.compile(r"(?:a )?map|struct \S+|an? object")


def _wrong(what: str) -> Callable[[re.Match[str], _Ctx], _Hint]:
    """invalid type / invalid value / invalid length: "{what} ({got}); send {expected}"."""
    def build(m: re.Match[str], ctx: _Ctx) -> _Hint:
        expected, position = _split_position(m.group("rest"))
        got, expected = _unbacktick(m.group("got")), _unbacktick(expected).strip()
        field = _field(ctx)
        subject = {"field": field, **position}
        values = {"got": got, "expected": expected, "field": field or ""}
        if field:
            template = "Argument {field!q} " + what + " ({got}); send {expected} instead."
        elif what == "has the wrong type" and _TOP_LEVEL.fullmatch(expected):
            template = ("arguments_json has the wrong type ({got}); send one JSON object with "
                        "the tool's arguments.")
        else:
            template = "An argument " + what + " ({got}); send {expected} instead."
        return _Hint(template, values, subject)
    return build


def _pydantic(m: re.Match[str], ctx: _Ctx) -> _Hint:
    field = _collapse(m.group("loc")).replace(" -> ", ".")
    message, kind = _collapse(m.group("msg")).rstrip("."), (m.group("type") or "")
    subject = {"field": field}
    if kind == "missing":
        return _Hint("Argument {field!q} is missing; add it to arguments_json.",
                     {"field": field}, subject)
    if kind.startswith("json_"):
        return _Hint("arguments_json is not valid JSON ({message}); send exactly one JSON "
                     "object.", {"message": message}, {}, "invalid_text_representation")
    return _Hint("Argument {field!q} is invalid: {message}; fix it in arguments_json.",
                 {"field": field, "message": message}, subject)


def _syntax(m: re.Match[str], ctx: _Ctx) -> _Hint:
    what = _backticks_to_quotes(m.group("what"))
    line, column = m.group("line"), m.group("column_no")
    return _Hint("arguments_json is not valid JSON ({what} at line {line}, column {column}); "
                 "send exactly one JSON object.",
                 {"what": what, "line": line, "column": column},
                 {"line": line, "column_no": column})


def _input_syntax(m: re.Match[str], ctx: _Ctx) -> _Hint:
    kind, value = _collapse(m.group("type")).rstrip("."), m.group("value")
    if value is not None:
        return _Hint("Value {value!q} is not a valid {kind}; send a valid {kind} value.",
                     {"value": value, "kind": kind}, {"value": value})
    return _Hint("The input is not valid {kind}; send a valid {kind} value.", {"kind": kind}, {})


# ---- the rule table ----------------------------------------------------------------------

_FLAGS = re.IGNORECASE | re.DOTALL
_DETAIL = r"[\s.;]*DETAIL:\s*"
# A key's column list as PostgreSQL prints it: `id`, `a, b`, `lower(email)`; no backtracking.
_COLS = r"[^()\n]*(?:\([^()\n]*\)[^()\n]*)*"
_QUOTED_PATH = r"(?P<q>['\"])(?P<path>[^\n]*)(?P=q)"  # greedy: up to the line's last quote


def _rule(category: str, keywords: str | tuple[str, ...], pattern: str,
          build: Callable[[re.Match[str], _Ctx], _Hint]) -> _Rule:
    words = (keywords,) if isinstance(keywords, str) else keywords
    return _Rule(category, tuple(w.lower() for w in words), re.compile(pattern, _FLAGS), build)


_OBJECT_KINDS = ("relation", "table", "view", "schema", "type", "role", "database", "sequence",
                 "index", "extension", "trigger", "constraint")

# (category, keywords a match starts with, pattern, builder); most specific first.
_RULES: tuple[_Rule, ...] = (
    # -- limits: the message may quote anything, so it goes first
    _rule("program_limit_exceeded", "program limit exceeded",
          r"program limit exceeded(?::\s*(?P<detail>[^\n]*))?", _limit),
    _rule("program_limit_exceeded", ("too many ", "request is too large"),
          r"(?:etcdserver: )?(?P<detail>too many (?:connections|clients|keys|writes|operations"
          r"|rows|columns|steps|requests|open files|effects|entries|arguments)\b[^\n]*"
          r"|request is too large[^\n]*)", _limit),
    # -- locks (55P03)
    _rule("lock_not_available", "could not obtain lock on ",
          r"could not obtain lock on (?:row in )?relation \"(?P<table>[^\"\n]*)\""
          r"(?:" + _DETAIL + r"Path " + _QUOTED_PATH + r" is locked)?", _lock_row),
    _rule("lock_not_available", ("canceling statement due to lock timeout", "deadlock detected"),
          r"canceling statement due to lock timeout|deadlock detected", _lock_other),
    # -- integrity constraints (class 23)
    _rule("unique_violation", "duplicate key value violates unique constraint",
          r"duplicate key value violates unique constraint \"(?P<constraint>[^\"\n]*)\""
          r"(?:" + _DETAIL + r"Key \((?P<column>" + _COLS + r")\)=\((?P<value>.*)\)"
          r" already exists)?", _unique),
    _rule("foreign_key_violation", "insert or update on table",
          r"insert or update on table \"(?P<table>[^\"\n]*)\" violates foreign key constraint"
          r" \"(?P<constraint>[^\"\n]*)\"(?:" + _DETAIL + r"Key \((?P<column>" + _COLS
          + r")\)=\((?P<value>.*)\) is not present in table \"(?P<ref_table>[^\"\n]*)\")?",
          _fk_insert),
    _rule("foreign_key_violation", "update or delete on table",
          r"update or delete on table \"(?P<table>[^\"\n]*)\" violates foreign key constraint"
          r" \"(?P<constraint>[^\"\n]*)\"(?: on table \"(?P<ref_table>[^\"\n]*)\")?"
          r"(?:" + _DETAIL + r"Key \((?P<column>" + _COLS + r")\)=\((?P<value>.*)\) is still"
          r" referenced from table \"(?P<referencing>[^\"\n]*)\")?", _fk_delete),
    _rule("not_null_violation", "null value in column",
          r"null value in column \"(?P<column>[^\n]*?)\""
          r"(?: of relation \"(?P<table>[^\"\n]*)\")? violates not-null constraint", _not_null),
    # -- missing data (P0002)
    _rule("no_data_found", "no row with ",
          r"no row with (?P<col>[\w.]+)=(?P<val>.*) in table"
          r" (?:\"(?P<table>[^\"\n]*)\"|(?P<table_bare>\w+))", _no_row),
    _rule("no_data_found", "query returned no rows", r"query returned no rows", _no_rows),
    # -- references and names (class 42); column rules before the `relation "x"` one
    _rule("undefined_column", 'column "',
          r"column \"(?P<column>[^\n]*?)\" does not exist in the output of step"
          r" \"?(?P<step>[^\"\s;,()]+)", _step_output),
    _rule("undefined_column", 'column "',
          r"column \"(?P<column>[^\n]*?)\"(?: of relation \"(?P<table>[^\"\n]*)\")?"
          r" does not exist", _column),
    _rule("undefined_object", "step ",
          r"step (?:\"(?P<step>[^\"\n]*)\"|(?P<step_bare>[^\s\"]+)) does not exist"
          r"(?P<rest>[^\n]*)", _step),
    _rule("undefined_object", "channel ",
          r"channel (?:\"(?P<channel>[^\n]*?)\"|(?P<channel_bare>[^\s\"]+)) does not exist"
          r"(?:[;,.]?\s*configured channels:[ \t]*(?P<channels>[^\n]*))?", _channel),
    _rule("undefined_object", tuple(kind + ' "' for kind in _OBJECT_KINDS),
          r"(?P<kind>" + "|".join(_OBJECT_KINDS) + r") \"(?P<name>[^\n]*?)\" does not exist",
          _named_object),
    _rule("undefined_function", "function ",
          r"function (?P<tool>[^\n]*?)\([^()\n]*\) does not exist", _function),
    _rule("undefined_function", "unknown tool",
          r"unknown tool:?\s*(?:\"(?P<tool_q>[^\"\n]*)\"|'(?P<tool_s>[^'\n]*)'"
          r"|(?P<tool_bare>[^\s;,]+))", _function),
    _rule("invalid_name", "invalid name syntax",
          r"invalid name syntax:\s*(?P<kind>\w+) \"(?P<name>[^\n]*)\" must match"
          r" (?P<pattern>[^\n]*)", _invalid_name),
    _rule("invalid_name", "invalid name syntax",
          r"invalid name syntax(?::\s*(?P<kind>\w+) \"(?P<name2>[^\"\n]*)\")?", _invalid_name),
    # -- privileges (42501)
    _rule("insufficient_privilege", "permission denied for path ",
          r"permission denied for path " + _QUOTED_PATH + r"(?::\s*(?P<reason>[^\n]*))?",
          _sandbox),
    _rule("insufficient_privilege", "permission denied for ",
          r"permission denied for (?P<kind>table|relation|view|schema|sequence|function"
          r"|database|column|tablespace|large object) (?P<name>[^\s;,]+)", _pg_permission),
    _rule("insufficient_privilege", ("permission denied", "operation not permitted"),
          r"(?:\[Errno (?:1|13)\] )?(?:permission denied|operation not permitted)"
          r"(?::\s*" + _QUOTED_PATH + r")?", _posix_permission),
    # -- files (58P01)
    _rule("undefined_file", "could not ",
          r"could not (?:open|stat|read) file \"(?P<path>[^\"\n]*)\": No such file or directory",
          _no_file),
    _rule("undefined_file", "no such file or directory",
          r"(?:\[Errno 2\] )?No such file or directory(?:(?::\s*|,\s*\w+\s+)" + _QUOTED_PATH
          + r")?", _no_file),
    # -- arguments (22023): serde's data errors, POSIX path-kind errors, pydantic
    _rule("invalid_parameter_value", "missing field `",
          r"missing field `(?P<name>[^`\n]*)`(?P<rest>[^\n]*)", _missing),
    _rule("invalid_parameter_value", "unknown field `",
          r"unknown field `(?P<name>[^`\n]*)`(?:, (?:expected (?:one of )?|there are no fields)"
          r")?(?P<rest>[^\n]*)", _unknown_field),
    _rule("invalid_parameter_value", "duplicate field `",
          r"duplicate field `(?P<name>[^`\n]*)`(?P<rest>[^\n]*)", _duplicate_field),
    _rule("invalid_parameter_value", "unknown variant `",
          r"unknown variant `(?P<value>[^`\n]*)`(?:, (?:expected (?:one of )?|there are no"
          r" variants))?(?P<rest>[^\n]*)", _unknown_variant),
    _rule("invalid_parameter_value", "invalid type: ",
          r"invalid type: (?P<got>[^\n]+?), expected (?P<rest>[^\n]+)",
          _wrong("has the wrong type")),
    _rule("invalid_parameter_value", "invalid value: ",
          r"invalid value: (?P<got>[^\n]+?), expected (?P<rest>[^\n]+)",
          _wrong("has an invalid value")),
    _rule("invalid_parameter_value", "invalid length ",
          r"invalid length (?P<got>\d+), expected (?P<rest>[^\n]+)",
          _wrong("has the wrong length")),
    _rule("invalid_parameter_value", "is a directory",
          r"(?:\[Errno 21\] )?Is a directory(?::\s*" + _QUOTED_PATH + r")?", _is_dir),
    _rule("invalid_parameter_value", "not a directory",
          r"(?:\[Errno 20\] )?Not a directory(?::\s*" + _QUOTED_PATH + r")?", _not_dir),
    _rule("invalid_parameter_value", "validation error",
          r"(?:\d+ )?validation errors? for [^\n]*\n(?P<loc>[^\n]+)\n[ \t]+(?P<msg>[^\n]+?)"
          r"(?: \[type=(?P<type>\w+)[^\n]*)?(?=\n|\Z)", _pydantic),
    # -- malformed JSON (22P02): serde_json, Python's json, PostgreSQL
    _rule("invalid_text_representation",
          ("eof while parsing", "expected ", "invalid escape", "invalid number",
           "invalid unicode code point", "number out of range", "control character",
           "key must be a string", "invalid value: expected key", "float key must be finite",
           "lone leading surrogate", "trailing comma", "trailing characters",
           "unexpected end of hex escape", "recursion limit exceeded"),
          r"(?P<what>EOF while parsing (?:a list|an object|a string|a value)"
          r"|expected (?:`[^`\n]*`(?: or `[^`\n]*`)?|ident|value)"
          r"|invalid (?:escape|number|unicode code point)|number out of range"
          r"|control character [^\n]{0,20}? found while parsing a string"
          r"|key must be a string|invalid value: expected key to be a number in quotes"
          r"|float key must be finite [^\n]{0,30}?|lone leading surrogate in hex escape"
          r"|trailing comma|trailing characters|unexpected end of hex escape"
          r"|recursion limit exceeded) at line (?P<line>\d+) column (?P<column_no>\d+)",
          _syntax),
    _rule("invalid_text_representation",
          ("expecting", "extra data", "unterminated string", "invalid control character",
           "invalid \\"),
          r"(?P<what>(?:Expecting|Extra data|Unterminated string|Invalid control character"
          r"|Invalid \\)[^:\n]{0,80}): line (?P<line>\d+) column (?P<column_no>\d+)"
          r" \(char \d+\)", _syntax),
    _rule("invalid_text_representation", "invalid input syntax for ",
          r"invalid input syntax for (?:type )?(?P<type>[^:\n\"]+?)"
          r"(?::\s*\"(?P<value>[^\n]*)\"|[ \t.;]*(?=\n|\Z))", _input_syntax),
)
