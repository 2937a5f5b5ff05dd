"""The one way a test waits: for a condition, never for time.

`eventually(condition, timeout, what)` calls `condition` until it returns something
truthy (which it returns) or stops raising one of `retry_on`; after `timeout` seconds it
fails with `what` and the last value or error seen, so a slow machine costs time, never a
flaky failure, and a real failure says what never happened. Give timeouts derived from
the settings the test gave the service (a sweep interval, a lease TTL, a claim), plus a
margin for a busy machine (`slack`), not a guess.

`eventually_async` is the same for coroutines, for tests that run in the event loop.
The pause between checks starts at `interval` and grows by `backoff` up to 0.5 s (or
`interval`, if longer); `backoff=1` keeps it constant, for tests that measure how soon
something happened.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

T = TypeVar("T")

# How much slower than on a quiet machine a check may be before it is a failure: CI and
# a laptop beside a busy core (`make test` is run beside two spinning processes).
SLACK = float(os.environ.get("AGENTTX_TEST_SLACK", "3.0"))
DEFAULT_RETRY: tuple[type[BaseException], ...] = (AssertionError, grpc.RpcError)


def slack(seconds: float) -> float:
    """A deadline for something the service does within `seconds` on a quiet machine."""
    return seconds * SLACK + 5.0


def _failure(what: str, timeout: float, last: Any) -> AssertionError:
    if isinstance(last, BaseException):
        detail = f"{type(last).__name__}: {last}"
        if isinstance(last, grpc.RpcError):
            detail = f"{last.code().name}: {last.details()}"  # type: ignore[attr-defined]
    else:
        detail = repr(last)
    return AssertionError(f"{what}: still not true after {timeout:g}s (last: {detail})")


def eventually(condition: Callable[[], T], timeout: float, what: str, *,
               interval: float = 0.05, backoff: float = 1.5,
               retry_on: tuple[type[BaseException], ...] = DEFAULT_RETRY) -> T:
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        try:
            value = condition()
            if value:
                return value
            last: Any = value
        except retry_on as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, last) from (last if isinstance(last, BaseException)
                                                      else None)
        time.sleep(pause)
        pause = min(pause * backoff, max(interval, 0.5))


async def eventually_async(condition: Callable[[], Awaitable[T]], timeout: float, what: str,
                           *, interval: float = 0.05, backoff: float = 1.5,
                           retry_on: tuple[type[BaseException], ...] = DEFAULT_RETRY) -> T:
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        try:
            value = await condition()
            if value:
                return value
            last: Any = value
        except retry_on as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, last) from (last if isinstance(last, BaseException)
                                                      else None)
        await asyncio.sleep(pause)
        pause = min(pause * backoff, max(interval, 0.5))


__all__ = ["SLACK", "eventually", "eventually_async", "slack"]
