"""A step's arguments, parsed and resolved without holding the event loop.

Why: one replica answers every call, health checks included, from one asyncio loop. A
1 MiB argument document of many `${steps.N…}` references costs hundreds of milliseconds
of CPU to parse, to search for references and to resolve them; done on the loop, every
other call waits that long (docs/architecture.md, "The event loop is never held"). The
rule: this work never holds the loop for more than 50 ms.

How: a document longer than PARSE_INLINE_CHARS is parsed, and its references found, on a
worker thread; resolution first runs on the loop within RESOLVE_INLINE_BUDGET and moves
to the worker when the references or the values they name cost more (`refs.OverBudget`).
A thread does not make the work cheaper, it lets the loop run beside it: while the
worker runs Python code CPython hands the GIL to a waiting thread every switch interval
(5 ms by default), and the C-level scans in `agenttx.args` read large texts in bounded
slices, so no single call keeps the GIL long (tests/integration/test_loop_free.py measures
what a health check waits while a 1 MiB step runs). One worker thread only: more would
just compete with the loop for the GIL, never finish sooner.

Small documents, the common case, stay on the loop: a thread hop costs more than they do.
What it must never do: change an outcome. Off the loop or not, the same value, references
and errors come back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..args.jsonargs import ArgumentsError, parse_arguments
from ..args.refs import OverBudget, Reference, Resolution, find_references, resolve

__all__ = ["PARSE_INLINE_CHARS", "RESOLVE_INLINE_BUDGET", "parse_step_arguments",
           "resolve_step_arguments"]

T = TypeVar("T")

# Documents up to this many characters are parsed on the loop: the worst shapes cost at
# most ~10 ms of CPU on a busy 2-core machine (scripts/bench_args.py --size 16384), well
# below the 50 ms rule; nearly every step's arguments are far smaller.
PARSE_INLINE_CHARS = 16 * 1024
# Resolution on the loop stops after about this much work (characters of JSON text, see
# refs.resolve): a few milliseconds at most; 256 references, or values of 64 KiB.
RESOLVE_INLINE_BUDGET = 64 * 1024

_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agenttx-arguments")

Parsed = tuple[dict[str, Any] | None, str | None, list[Reference]]


def _parse_now(arguments_json: str) -> Parsed:
    try:
        parsed = parse_arguments(arguments_json)
    except ArgumentsError as exc:
        return None, str(exc.args[0]), []
    if not may_refer(arguments_json):
        return parsed, None, []  # one pass: no walk of the tree, and resolve returns it as is
    return parsed, None, find_references(parsed)


def may_refer(arguments_json: str) -> bool:
    """Whether a decoded string of this document can hold `${steps.`: JSON writes a `$`
    either as itself or as a `\\u` escape, so a text with neither holds no reference,
    and the decoded tree need not be walked for one (the common case: most steps refer
    to nothing)."""
    return "$" in arguments_json or "\\u" in arguments_json


async def parse_step_arguments(arguments_json: str) -> Parsed:
    """(arguments, None, their references), or (None, serde-style message, []): a
    malformed document is a failed step, not an RPC error (docs/tools.md)."""
    if len(arguments_json) <= PARSE_INLINE_CHARS:
        return _parse_now(arguments_json)
    return await _off_loop(_parse_now, arguments_json)


async def resolve_step_arguments(args: Any, outputs: Mapping[int, Any], live: range,
                                 references: list[Reference]) -> Resolution:
    """refs.resolve, on the loop when it is cheap, else on the worker thread. Raises what
    resolve raises (ReferenceError_ for a reference that cannot be resolved)."""
    try:
        return resolve(args, outputs, live, references, budget=RESOLVE_INLINE_BUDGET)
    except OverBudget:
        return await _off_loop(resolve, args, outputs, live, references)


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_worker, fn, *args)
