"""`${steps.N.path}` references in step arguments: finding them, resolving them, and saying
which step produced which argument.

A whole-string reference keeps the JSON type of the referenced value; an embedded one
interpolates as text (strings as-is, anything else as compact JSON). Dotted paths index
objects by key and arrays by position (ASCII digits). Only live steps can be referenced.

Why it is careful about cost: the text of a reference is user input inside a 1 MiB
document, so finding references is a scan that reads each character a bounded number of
times (no backtracking regex, no restart per `${`): a candidate ends at the first `}`
after it, and once no `}` is left nothing after can be a reference. Resolution charges
every expansion against MAX_EXPANSION and keeps the result within the JSON nesting limit.

The engine uses `Resolution.referenced` / `ReferenceError_.referenced` for dependencies and
`offending_step` for the culprit of a failed step (SPEC §5); both cover every reference in
the document, also those after the one that failed.

Pure functions; no I/O; imports nothing above `agenttx.args`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .jsonargs import MAX_DEPTH, dumps, json_depth

__all__ = ["MAX_EXPANSION", "OverBudget", "Reference", "ReferenceError_", "Resolution",
           "find_references", "has_reference", "offending_step", "resolve"]

# References may not expand the arguments beyond this many characters: one 1 MiB output
# referenced thousands of times would otherwise build gigabytes in memory before the
# engine's own size limit (8 MiB per step, engine.transactions) is ever checked.
MAX_EXPANSION = 8 * 1024 * 1024

_MARK = "${steps."
# What follows the mark: the step number, then `.segment`s, none empty, none holding `.` or
# `}`. Possessive, and matched at one position only: it reads up to the first `}` at most.
_BODY = re.compile(r"([0-9]++)((?:\.[^.}]++)*+)")
_WHOLE = re.compile(r"\$\{steps\.([0-9]++)((?:\.[^.}]++)*+)\}")  # fullmatch only
# Step ids are int64 on the wire; a longer number can never name a live step.
_MAX_STEP_DIGITS = 18
_SHOWN_DIGITS = 20  # a step number is shown whole up to this many digits
_SHOWN_REFERENCE = 80  # a reference's text is shown whole up to this many characters
_SHOWN_LIVE = 10  # live steps are listed one by one up to this many, else as a range
# What resolving costs, in the units of resolve()'s `budget` (characters of JSON text): a
# reference costs about what serialising this many characters does (a few µs of Python),
# plus its own length (its path is walked segment by segment); each item of a referenced
# value costs _ITEM_COST besides its strings.
REFERENCE_COST = 256
_ITEM_COST = 8


# Where a value sits: (where its container sits, key or index); None for the arguments
# themselves. Linked, so the values of one container share their prefix.
_Where = tuple[Any, str | int] | None


@dataclass(slots=True)
class Reference:
    """One `${steps.N.path}` in the arguments."""

    argument: str  # dotted path of the argument holding it: "key", "fields.c", "items.0"
    step: int | None  # None when the number can never be a step id (e.g. 5000 digits)
    digits: str  # the step number as written
    path: tuple[str, ...]  # the segments after the step number
    raw: str  # the reference's text, "${steps.2.value.a}"
    offset: int  # where `raw` starts in the argument's string
    whole: bool  # the argument's string is exactly this reference (keeps the JSON type)
    _where: _Where = field(default=None, compare=False, repr=False)
    _levels: int = field(default=0, compare=False, repr=False)  # containers holding it


class OverBudget(Exception):
    """resolve() gave up: resolving these references costs more than its `budget`. Nothing
    was returned; the caller runs it again without a budget where the time is affordable
    (the engine: on a worker thread instead of the event loop)."""


class ReferenceError_(Exception):
    """Raised with a raw message for the cleaner (undefined_object / undefined_column /
    program_limit_exceeded). `referenced` is every live step the document references,
    before or after the failing reference, so the engine can still compute dependencies."""

    def __init__(self, message: str, argument: str, step: int | None,
                 referenced: frozenset[int] = frozenset()) -> None:
        super().__init__(message)
        self.message = message
        self.argument = argument
        self.step = step
        self.referenced = referenced


@dataclass
class Resolution:
    value: Any
    referenced: set[int] = field(default_factory=set)  # live steps the arguments reference
    # dotted argument path -> the step whose output produced (part of) its value
    provenance: dict[str, int] = field(default_factory=dict)


# ---- finding -----------------------------------------------------------------------------

def _scan(text: str) -> Iterator[tuple[int, int, str, str]]:
    """(start, end, digits, dotted segments) of each reference in `text`, in order.

    Linear: every `}` is searched for once (a later candidate reuses it), the body regex of
    a candidate reads no further than its `}`, and after a failed candidate the search goes
    on from where it failed (no candidate starting before that point can succeed: its body
    would run into the same empty segment or stray character)."""
    close = -1
    start = text.find(_MARK)
    while start >= 0:
        body = start + len(_MARK)
        if close < body:
            close = text.find("}", body)
            if close < 0:
                return  # no `}` left: nothing from here on is a reference
        m = _BODY.match(text, body, close + 1)
        if m is not None and m.end() == close:
            yield start, close + 1, m.group(1), m.group(2)
            start = text.find(_MARK, close + 1)
        else:
            start = text.find(_MARK, m.end() if m is not None else body)


def _step_number(digits: str) -> int | None:
    if len(digits) <= _MAX_STEP_DIGITS:
        return int(digits)
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= _MAX_STEP_DIGITS else None


def _marked(value: dict[str, Any] | list[Any]) -> list[tuple[_Where, int, str]]:
    """Every string value holding `${steps.`, with where it sits and in how many
    containers, in document order. One visit per container (recursion: JSON here nests at
    most MAX_DEPTH levels)."""
    found: list[tuple[_Where, int, str]] = []
    keep = found.append

    def visit(node: dict[str, Any] | list[Any], where: _Where, levels: int) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in items:
            if isinstance(item, str):
                if _MARK in item:
                    keep(((where, key), levels, item))
            elif isinstance(item, (dict, list)):
                visit(item, (where, key), levels + 1)

    visit(value, None, 1)
    return found


def _start(value: Any) -> list[tuple[_Where, int, str]]:
    if isinstance(value, str):
        return [(None, 0, value)] if _MARK in value else []
    return _marked(value) if isinstance(value, (dict, list)) else []


def _dotted(where: _Where, cache: dict[int, str]) -> str:
    """"fields.c" for ((None, "fields"), "c"); each container's path is built once."""
    if where is None:
        return ""
    parent, key = where
    if parent is None:
        return str(key)
    above = cache.get(id(parent))
    if above is None:
        above = cache[id(parent)] = _dotted(parent, cache)
    return f"{above}.{key}"


def find_references(args: Any) -> list[Reference]:
    """Every `${steps.N.path}` in the string values of `args`, in document order."""
    refs: list[Reference] = []
    cache: dict[int, str] = {}
    # One tuple per distinct path: a document repeating `${steps.1.value}` 50,000 times
    # holds one `("value",)`, not 50,000 objects for the garbage collector to walk.
    paths: dict[str, tuple[str, ...]] = {"": ()}
    for where, levels, text in _start(args):
        argument = _dotted(where, cache)
        whole = _WHOLE.fullmatch(text)  # the common case, in one C call
        found = [(0, len(text), whole.group(1), whole.group(2))] if whole else _scan(text)
        for start, end, digits, dotted in found:
            path = paths.get(dotted)
            if path is None:
                path = paths[dotted] = tuple(dotted.split(".")[1:])
            refs.append(Reference(argument=argument, step=_step_number(digits), digits=digits,
                                  path=path, raw=text[start:end], offset=start,
                                  whole=start == 0 and end == len(text), _where=where,
                                  _levels=levels))
    return refs


def has_reference(value: Any) -> bool:
    """Whether any string value holds `${steps.` (a reference, or text that looks like one)."""
    return bool(_start(value))


# ---- resolving ---------------------------------------------------------------------------

def _shown_step(digits: str) -> str:
    if len(digits) <= _SHOWN_DIGITS:
        return digits
    return f"{digits[:12]}…({len(digits)} digits)"


def _shown(raw: str) -> str:
    if len(raw) <= _SHOWN_REFERENCE:
        return raw
    return raw[:_SHOWN_REFERENCE - 20] + "…" + raw[-19:]


def _shown_live(live: range) -> str:
    if len(live) == 0:
        return "none"
    if len(live) <= _SHOWN_LIVE:
        return ", ".join(map(str, live))
    return f"{live[0]}-{live[-1]}"


@dataclass(slots=True)
class _Found:
    value: Any
    text: str  # the value as it interpolates: a string as-is, anything else compact JSON
    _depth: int | None = None

    def depth(self) -> int:
        if self._depth is None:
            self._depth = 0 if isinstance(self.value, str) else json_depth(self.text)
        return self._depth


class _Resolver:
    def __init__(self, outputs: Mapping[int, Any], live: range,
                 referenced: frozenset[int], budget: int | None) -> None:
        self.outputs, self.live, self.referenced = outputs, live, referenced
        self.budget = budget  # what is left of it; None: unbounded
        self.provenance: dict[str, int] = {}
        self.expanded = 0
        self.seen: dict[tuple[int, tuple[str, ...]], _Found] = {}  # each value looked up once

    def fail(self, message: str, ref: Reference) -> ReferenceError_:
        return ReferenceError_(message, ref.argument, ref.step, self.referenced)

    def lookup(self, ref: Reference) -> _Found:
        step = ref.step
        if step is None or step not in self.live:
            raise self.fail(f'step "{_shown_step(ref.digits)}" does not exist (referenced as '
                            f"{_shown(ref.raw)}); live steps: {_shown_live(self.live)}", ref)
        key = (step, ref.path)
        if key not in self.seen:
            if step not in self.outputs:
                raise ValueError(f"resolve: the output of live step {step} was not given")
            cur = self.outputs[step]
            for i, seg in enumerate(ref.path):
                if isinstance(cur, Mapping) and seg in cur:
                    cur = cur[seg]
                elif isinstance(cur, list) and seg.isascii() and seg.isdigit() \
                        and len(seg) <= _MAX_STEP_DIGITS and int(seg) < len(cur):
                    cur = cur[int(seg)]
                else:
                    shown = ".".join(ref.path[: i + 1])
                    raise self.fail(f'column "{shown}" does not exist in the output of step '
                                    f"{step} (referenced as {_shown(ref.raw)})", ref)
            if self.budget is not None:  # charged before the text is built
                self.budget -= _text_cost(cur, self.budget)
            self.seen[key] = _Found(cur, cur if isinstance(cur, str) else dumps(cur))
        found = self.seen[key]
        self.expanded += len(found.text)
        if self.expanded > MAX_EXPANSION:
            raise self.fail(f"program limit exceeded: references expand the arguments to more "
                            f"than {MAX_EXPANSION} characters (referenced as {_shown(ref.raw)})",
                            ref)
        self.provenance[ref.argument] = step
        return found

    def whole(self, ref: Reference) -> Any:
        found = self.lookup(ref)
        if found.depth() > MAX_DEPTH - ref._levels:
            raise self.fail(f"program limit exceeded: references nest the arguments deeper than "
                            f"{MAX_DEPTH} levels (referenced as {_shown(ref.raw)} in "
                            f"{ref.argument or 'the arguments'})", ref)
        return found.value


def resolve(args: Any, outputs: Mapping[int, Any], live: range,
            references: list[Reference] | None = None, *,
            budget: int | None = None) -> Resolution:
    """Replace the references in every string of `args` with values from `outputs`.

    `live` is the range of live step ids (in AgentTx always `range(1, next_step_id)`);
    `outputs` must hold the output of every live step the arguments reference (and may
    hold only those: see `find_references`, whose result can be passed as `references`
    to save a second scan). Raises ReferenceError_ for the first reference, in document
    order, that names a step that is not live or a path its output lacks, or that would
    expand or nest the arguments beyond the limits. Containers without references are
    shared with `args`, not copied.

    `budget` bounds the work, in characters of JSON text (a reference counts as
    REFERENCE_COST): once the references, or the values they name, would cost more, it
    raises OverBudget having spent at most about `budget`. A caller that must not be held
    long (the event loop) resolves small cases at once and the rest elsewhere. The outcome
    never depends on the budget: an error met within it is the error the unbounded call
    raises first, as both follow document order."""
    refs = find_references(args) if references is None else references
    if not refs:
        return Resolution(value=args)
    if budget is not None:  # each reference, and each segment of its path, is Python work
        cost = len(refs) * REFERENCE_COST  # checked first: 50k references are not summed
        if cost <= budget:
            cost += sum(len(r.raw) for r in refs)
        if cost > budget:
            raise OverBudget(f"{len(refs)} references cost more than {budget}")
        budget -= cost
    referenced = frozenset(r.step for r in refs if r.step is not None and r.step in live)
    resolver = _Resolver(outputs, live, referenced, budget)
    # The new value of every string holding references, in document order (errors too).
    strings: dict[int, _New] = {}
    i = 0
    while i < len(refs):
        ref, j = refs[i], i + 1
        while j < len(refs) and refs[j]._where is ref._where:  # the same string
            j += 1
        if ref.whole:
            new = _New(ref._where, value=resolver.whole(ref))
        else:
            pieces = refs[i:j]
            new = _New(ref._where, pieces=pieces,
                       texts=[resolver.lookup(r).text for r in pieces])
        strings[id(ref._where)] = new
        i = j
    value = _rebuild(args, strings)
    return Resolution(value=value, referenced=set(referenced), provenance=resolver.provenance)


def _text_cost(value: Any, budget: int) -> int:
    """About what `value` costs to serialise (characters, plus _ITEM_COST per item); raises
    OverBudget as soon as that exceeds `budget`. A container is charged for its items
    before they are looked at, so the walk itself costs at most about `budget` (a value of
    a million items is never walked through)."""
    if isinstance(value, str):
        cost = len(value)
    elif not isinstance(value, (dict, list)):
        cost = _ITEM_COST
    else:
        cost, stack = 0, [value]
        while stack and cost <= budget:
            node = stack.pop()
            cost += _ITEM_COST * (len(node) + 1)
            if cost > budget:
                break
            if isinstance(node, dict):
                cost += sum(map(len, node))
            for item in node.values() if isinstance(node, dict) else node:
                if isinstance(item, str):
                    cost += len(item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
    if cost > budget:
        raise OverBudget(f"a referenced value of more than {budget} characters")
    return cost


@dataclass(slots=True)
class _New:
    """What one string becomes: a referenced value, or its text with pieces interpolated.
    One object per string: a 1 MiB document holds tens of thousands of them, and every
    object is work for the garbage collector, which holds the GIL while it walks them."""

    where: _Where  # where the string sits
    value: Any = None
    pieces: list[Reference] | None = None  # the references in the string, in order
    texts: list[str] | None = None  # what each one interpolates (no tuple per reference)

    def apply(self, original: str) -> Any:
        if self.pieces is None or self.texts is None:
            return self.value
        out, pos = [], 0
        for ref, text in zip(self.pieces, self.texts, strict=True):
            out.append(original[pos:ref.offset])
            out.append(text)
            pos = ref.offset + len(ref.raw)
        out.append(original[pos:])
        return "".join(out)


def _rebuild(args: Any, strings: dict[int, _New]) -> Any:
    """A copy of `args` with the strings replaced; only containers on the way are copied."""
    root = 0  # stands for the arguments themselves (where None)
    kids: dict[int, dict[str | int, _Where]] = {}  # container -> the keys to replace in it
    for where in (new.where for new in strings.values()):
        node = where
        while node is not None:
            parent, key = node
            slot = id(parent) if parent is not None else root
            linked = slot in kids
            kids.setdefault(slot, {})[key] = node
            if linked:
                break
            node = parent

    def build(node: Any, slot: int) -> Any:
        copy: Any = dict(node) if isinstance(node, dict) else list(node)
        for key, where in kids.get(slot, {}).items():
            child = node[key]
            if isinstance(child, str):
                copy[key] = strings[id(where)].apply(child)
            else:
                copy[key] = build(child, id(where))
        return copy

    if isinstance(args, str):
        return strings[id(None)].apply(args)
    return build(args, root)


# ---- culprits ----------------------------------------------------------------------------

def offending_step(argument: str | None, provenance: Mapping[str, int]) -> int | None:
    """The step whose output produced the offending `argument` (SPEC §5 culprit rule).

    The argument may be a referenced path itself, lie below one (`fields.c` when the whole
    `fields` object came from `${steps.2.value}`), or lie above one (`fields` when the
    reference sat at `fields.c`). No provenance, no culprit: None."""
    if not argument:
        return None
    if argument in provenance:
        return provenance[argument]
    parent = argument
    while "." in parent:
        parent = parent.rsplit(".", 1)[0]
        if parent in provenance:
            return provenance[parent]
    below = argument + "."
    for path, step in provenance.items():
        if path.startswith(below):
            return step
    return None
