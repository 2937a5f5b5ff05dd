"""`agenttx.engine.arguments`: a step's arguments are parsed and resolved on the event loop
when that is cheap, and on a worker thread otherwise, so the loop keeps answering other
calls (docs/architecture.md, "The event loop is never held").

What a caller can observe: whether awaiting the call lets other coroutines run (a call
that stays on the loop never suspends; one that went to the thread does), and that the
outcome is the same either way. The latency the loop sees while a 1 MiB step runs in a
real replica is measured in tests/integration/test_loop_free.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import pytest

from agenttx.args import ReferenceError_, find_references, parse_arguments, resolve
from agenttx.engine.arguments import (
    PARSE_INLINE_CHARS,
    parse_step_arguments,
    resolve_step_arguments,
)

MIB = 1024 * 1024
OUTPUTS = {1: {"key": "k", "value": 7}}
LIVE = range(1, 2)


async def ticks_while(call: Awaitable[Any]) -> tuple[Any, int]:
    """(the call's result, how many turns another coroutine had while it was awaited).
    A call that never suspends gives the ticker no turn at all: its task starts only
    once the caller yields to the loop."""
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0.001)  # a tick per loop turn: what the test counts

    task = asyncio.create_task(ticker())
    try:
        result = await call
    finally:
        done = True
        await task
    return result, ticks


def references_document(size: int) -> str:
    unit = '"${steps.1.value}",'
    return '{"key":"k","value":[' + unit * ((size - 40) // len(unit)) + '"${steps.1.value}"]}'


async def test_a_large_document_is_parsed_while_the_loop_keeps_running() -> None:
    text = references_document(MIB // 4)
    (value, error, refs), ticks = await ticks_while(parse_step_arguments(text))
    assert ticks > 0, "the loop did not run while a 1 MiB document was parsed"
    assert error is None and value == json.loads(text)
    assert refs == find_references(value)


async def test_a_large_malformed_document_is_a_message_from_the_worker_too() -> None:
    text = references_document(MIB // 4)[:-2]
    (value, error, refs), ticks = await ticks_while(parse_step_arguments(text))
    assert ticks > 0
    assert (value, refs) == (None, [])
    assert error == f"EOF while parsing a list at line 1 column {len(text)}"


@pytest.mark.parametrize("text", ['{"key": "a", "value": 1}', "", "{", "[1]",
                                  references_document(PARSE_INLINE_CHARS)])
async def test_a_small_document_is_parsed_without_leaving_the_loop(text: str) -> None:
    (value, error, refs), ticks = await ticks_while(parse_step_arguments(text))
    assert ticks == 0, "a small document was sent to the worker thread"
    if error is None:
        assert value == parse_arguments(text) and refs == find_references(value)
    else:
        assert value is None and refs == []


async def test_a_few_references_are_resolved_without_leaving_the_loop() -> None:
    args = {"key": "k", "value": ["${steps.1.value}"] * 10, "label": "v=${steps.1.key}"}
    resolution, ticks = await ticks_while(
        resolve_step_arguments(args, OUTPUTS, LIVE, find_references(args)))
    assert ticks == 0
    assert resolution.value == {"key": "k", "value": [7] * 10, "label": "v=k"}


@pytest.mark.parametrize("args, outputs", [
    ({"value": ["${steps.1.value}"] * 5_000}, OUTPUTS),
    ({"value": "${steps.1.value}"}, {1: {"value": list(range(200_000))}}),
], ids=["5k-references", "one-large-value"])
async def test_costly_references_are_resolved_on_the_worker(args: Any, outputs: Any) -> None:
    resolution, ticks = await ticks_while(
        resolve_step_arguments(args, outputs, LIVE, find_references(args)))
    assert ticks > 0, "the loop did not run while costly references were resolved"
    assert resolution.value == resolve(args, outputs, LIVE).value


async def test_a_reference_error_from_the_worker_is_the_same_error() -> None:
    args = {"value": ["${steps.1.value}"] * 5_000 + ["${steps.3.value}"]}
    with pytest.raises(ReferenceError_) as off_loop:
        await resolve_step_arguments(args, OUTPUTS, LIVE, find_references(args))
    with pytest.raises(ReferenceError_) as inline:
        resolve(args, OUTPUTS, LIVE)
    assert off_loop.value.message == inline.value.message == \
        'step "3" does not exist (referenced as ${steps.3.value}); live steps: 1'
    assert off_loop.value.argument == "value.5000"


@pytest.mark.parametrize("text", [
    '{"a": "${steps.1.key}"}',
    '{"a": "\\u0024{steps.1.key}"}',          # `$` escaped
    '{"a": ["x ${steps.1.value} y"]}',
])
async def test_a_reference_is_found_however_its_dollar_is_written(text):
    parsed, error, references = await parse_step_arguments(text)
    assert error is None
    assert [r.step for r in references] == [1]
    assert resolve(parsed, OUTPUTS, LIVE, references).referenced == {1}


async def test_arguments_without_a_dollar_come_back_as_parsed_with_no_references():
    text = '{"key": "k", "value": {"n": [1, 2, "steps.1"]}}'
    parsed, error, references = await parse_step_arguments(text)
    assert (parsed, error, references) == (json.loads(text), None, [])
    assert resolve(parsed, OUTPUTS, LIVE, references).value is parsed
