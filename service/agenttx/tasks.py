"""Long-running background tasks of one component: started by name, stopped together.

Why one helper: every component that works in the background (the readiness probe, the
replica's presence lease, the policy and issuer-key watches, the leader keepalive, the
dispatcher, the reaper, the operator's sweeps) needs the same three things, and the
copies that grew apart got them subtly different: keep a reference so the task is not
garbage-collected, stop by cancelling *and awaiting* (so nothing runs after `stop()`
returns), and never let a task that died of an exception go unnoticed (it is logged
with its traceback the moment it ends, not swallowed at shutdown).

What it must never do: import anything of the service (it sits in the lowest layer, so
the store, the workers, the server and the operator can all use it), or wait forever at
stop: a task that ignores its cancellation is reported and left behind after `grace_s`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    """The background tasks of `owner` (a name for the logs)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def running(self) -> bool:
        """True while any task started here has not finished."""
        return any(not t.done() for t in self._tasks)

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `coro` as a task named `name` until it returns or `stop()` cancels it."""
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._report)
        self._tasks.append(task)
        return task

    def _report(self, task: asyncio.Task[Any]) -> None:
        self._tasks = [t for t in self._tasks if not t.done()]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("background task failed", exc_info=exc,
                      extra={"owner": self.owner, "task": task.get_name(),
                             "error": f"{type(exc).__name__}: {exc}"})

    async def stop(self, grace_s: float = 10.0) -> None:
        """Cancel every task and wait until each has finished (at most `grace_s`).

        Safe to call twice, and from inside one of the tasks (that one is cancelled last
        by its own return, not awaited)."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        self._tasks = [t for t in self._tasks if t is current]
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            log.error("background task ignored its cancellation; left running",
                      extra={"owner": self.owner, "task": task.get_name(), "grace_s": grace_s})


__all__ = ["BackgroundTasks"]
