"""The one background-task helper (`agenttx.tasks.BackgroundTasks`): stop cancels and
waits, a task that dies is reported when it dies, and stop never hangs. Pure asyncio."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agenttx.tasks import BackgroundTasks


async def test_stop_cancels_every_task_and_returns_only_once_each_has_finished() -> None:
    tasks = BackgroundTasks("test")
    cleaned: list[str] = []
    started = asyncio.Event()

    async def forever(name: str) -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            cleaned.append(name)

    first = tasks.start(forever("a"), name="a")
    second = tasks.start(forever("b"), name="b")
    await started.wait()
    assert tasks.running
    await tasks.stop()
    assert sorted(cleaned) == ["a", "b"]
    assert first.cancelled() and second.cancelled() and not tasks.running
    await tasks.stop()  # a second stop is harmless


async def test_a_task_that_dies_is_logged_with_its_name_when_it_dies(
        caplog: pytest.LogCaptureFixture) -> None:
    tasks = BackgroundTasks("replica")

    async def broken() -> None:
        raise RuntimeError("etcd answered nonsense")

    with caplog.at_level(logging.ERROR, logger="agenttx.tasks"):
        task = tasks.start(broken(), name="dispatcher")
        await asyncio.wait([task])
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    failed = [r for r in caplog.records if r.getMessage() == "background task failed"]
    assert len(failed) == 1
    record = failed[0]
    assert (record.owner, record.task) == ("replica", "dispatcher")  # type: ignore[attr-defined]
    assert record.error == "RuntimeError: etcd answered nonsense"  # type: ignore[attr-defined]
    assert record.exc_info is not None and not tasks.running
    await tasks.stop()


async def test_stop_from_inside_one_of_its_own_tasks_does_not_wait_for_itself() -> None:
    tasks = BackgroundTasks("test")
    other_cancelled = asyncio.Event()

    async def other() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            other_cancelled.set()
            raise

    async def stopper() -> str:
        await asyncio.sleep(0)
        await tasks.stop()
        return "returned"

    tasks.start(other(), name="other")
    me = tasks.start(stopper(), name="stopper")
    assert await asyncio.wait_for(me, 5) == "returned"
    assert other_cancelled.is_set()


async def test_a_task_that_ignores_cancellation_is_reported_and_stop_still_returns(
        caplog: pytest.LogCaptureFixture) -> None:
    tasks = BackgroundTasks("test")
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    task = tasks.start(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="agenttx.tasks"):
        await asyncio.wait_for(tasks.stop(grace_s=0.2), 5)
    assert [r.task for r in caplog.records  # type: ignore[attr-defined]
            if r.getMessage().startswith("background task ignored")] == ["stubborn"]
    release.set()
    await asyncio.wait_for(task, 5)
