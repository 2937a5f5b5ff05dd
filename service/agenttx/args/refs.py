"""`${steps.N.path}` references in step arguments.

A whole-string reference keeps the JSON type of the referenced value; an embedded one
interpolates as text (strings as-is, anything else as compact JSON). Dotted paths index
objects by key and arrays by position. Only live steps can be referenced.
Pure functions; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .jsonargs import dumps

REF = re.compile(r"\$\{steps\.([0-9]+)((?:\.[^.}]+)*)\}")  # ASCII digits only, as in JSON
# References may not expand the arguments beyond this many characters: one 1 MiB output
# referenced thousands of times would otherwise build gigabytes in memory before the
# engine's own size limit (8 MiB per step, engine.transactions) is ever checked.
MAX_EXPANSION = 8 * 1024 * 1024


class ReferenceError_(Exception):
    """Raised with a raw message for the cleaner (undefined_object / undefined_column)."""

    def __init__(self, message: str, argument: str, step: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.argument = argument
        self.step = step
        self.referenced: set[int] = set()


@dataclass
class Resolution:
    value: Any
    referenced: set[int] = field(default_factory=set)
    # dotted argument path -> the step whose output produced (part of) its value
    provenance: dict[str, int] = field(default_factory=dict)


def _lookup(output: Any, path: list[str], step: int, ref: str, arg: str) -> Any:
    cur = output
    for i, seg in enumerate(path):
        if isinstance(cur, Mapping) and seg in cur:
            cur = cur[seg]
        elif isinstance(cur, list) and seg.isascii() and seg.isdigit() and int(seg) < len(cur):
            cur = cur[int(seg)]
        else:
            shown = ".".join(path[: i + 1])
            raise ReferenceError_(
                f'column "{shown}" does not exist in the output of step {step} '
                f"(referenced as {ref})", arg, step)
    return cur


@dataclass(frozen=True)
class Reference:
    step: int | None
    argument: str


def find_references(args: Any) -> list[Reference]:
    """Every reference in the document, in order (interim: steps only)."""
    out: list[Reference] = []

    def walk(value: Any, arg: str) -> None:
        if isinstance(value, str):
            if "${steps." in value:
                for m in REF.finditer(value):
                    try:
                        out.append(Reference(int(m.group(1)), arg))
                    except ValueError:
                        out.append(Reference(None, arg))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{arg}.{i}" if arg else str(i))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{arg}.{k}" if arg else k)

    walk(args, "")
    return out


def offending_step(argument: str | None, provenance: Mapping[str, int]) -> int | None:
    """The step whose output produced the offending argument (the path itself, a path
    below a whole-value reference, or a path above a reference)."""
    if not argument:
        return None
    if argument in provenance:
        return provenance[argument]
    for path, step in provenance.items():
        if argument.startswith(path + ".") or path.startswith(argument + "."):
            return step
    return None


def resolve(args: Any, outputs: Mapping[int, Any], live: range | None = None) -> Resolution:
    """Replace references in every string of `args` with values from live `outputs`."""
    live_set = live if live is not None else range(0)
    referenced = {r.step for r in find_references(args)
                  if r.step is not None and r.step in live_set}
    try:
        return _resolve(args, outputs, live)
    except ReferenceError_ as exc:
        exc.referenced = referenced
        raise


def _resolve(args: Any, outputs: Mapping[int, Any], live_range: range | None) -> Resolution:
    res = Resolution(value=None)
    live = list(live_range) if live_range is not None else sorted(outputs)
    sizes: dict[tuple[int, str], int] = {}  # (step, path) -> size of its value as text
    expanded = 0

    def one(m: re.Match[str], arg: str) -> Any:
        step = int(m.group(1))
        path = [p for p in m.group(2).split(".") if p]
        if step not in outputs or (live_range is not None and step not in live_range):
            shown = ", ".join(map(str, live)) or "none"
            raise ReferenceError_(
                f'step "{step}" does not exist (referenced as {m.group(0)}); '
                f"live steps: {shown}", arg, step)
        res.referenced.add(step)
        res.provenance[arg] = step
        value = _lookup(outputs[step], path, step, m.group(0), arg)
        nonlocal expanded
        key = (step, m.group(2))
        if key not in sizes:
            sizes[key] = len(_text(value))
        expanded += sizes[key]
        if expanded > MAX_EXPANSION:
            raise ReferenceError_(
                f"program limit exceeded: references expand the arguments to more than "
                f"{MAX_EXPANSION} characters (referenced as {m.group(0)})", arg, step)
        return value

    def walk(value: Any, arg: str) -> Any:
        if isinstance(value, str):
            whole = REF.fullmatch(value)
            if whole:
                return one(whole, arg)
            if "${steps." not in value:
                return value
            return REF.sub(lambda m: _text(one(m, arg)), value)
        if isinstance(value, list):
            return [walk(v, f"{arg}.{i}" if arg else str(i)) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: walk(v, f"{arg}.{k}" if arg else k) for k, v in value.items()}
        return value

    res.value = walk(args, "")
    return res


def _text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def has_reference(value: Any) -> bool:
    if isinstance(value, str):
        return "${steps." in value
    if isinstance(value, list):
        return any(has_reference(v) for v in value)
    if isinstance(value, dict):
        return any(has_reference(v) for v in value.values())
    return False
