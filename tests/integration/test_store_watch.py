"""The store's one watch loop (`agenttx.store.watch.Watch`) against a real etcd: it loads,
follows puts and deletes, comes back after etcd restarts, and never leaves a watch stream
open in etcd when its consumer fails.

The watcher count comes from etcd's own /metrics (`etcd_debugging_mvcc_watcher_total`),
on an etcd of the test's own so nothing else watches there.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence

import httpx2
import pytest

from agenttx import errors
from agenttx.embedded_etcd import EmbeddedEtcd
from agenttx.store.client import Store, connect
from agenttx.store.ops import KeyValue, WatchEvent
from agenttx.store.watch import BACKOFF_MAX_S, Watch
from support.waiting import eventually_async, slack


class View(Watch):
    """A consumer of the watch: key -> value, plus every event it was handed."""

    def __init__(self, store: Store, key: bytes, *, prefix: bool,
                 poison: bytes | None = None) -> None:
        super().__init__(store, key, prefix=prefix, what="test")
        self.values: dict[bytes, bytes] = {}
        self.snapshots = 0
        self.events: list[WatchEvent] = []
        self.poison = poison

    def on_snapshot(self, kvs: Sequence[KeyValue], revision: int) -> None:
        self.snapshots += 1
        self.values = {kv.key: kv.value for kv in kvs}

    def on_event(self, event: WatchEvent) -> None:
        self.events.append(event)
        if event.value is not None and event.value == self.poison:
            raise ValueError("the consumer cannot apply this value")
        if event.value is None:
            self.values.pop(event.key, None)
        else:
            self.values[event.key] = event.value


@pytest.fixture
def own_etcd(scratch) -> Iterator[EmbeddedEtcd]:
    server = EmbeddedEtcd(scratch / f"etcd-watch-{uuid.uuid4().hex[:6]}").start()
    yield server
    server.stop()


async def watchers(etcd: EmbeddedEtcd) -> int:
    """The number of watchers etcd is serving right now."""
    async with httpx2.AsyncClient() as http:
        text = (await http.get(f"http://{etcd.endpoints[0]}/metrics")).text
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    raise AssertionError("etcd does not report etcd_debugging_mvcc_watcher_total")


async def put_when_up(store: Store, key: bytes, value: bytes) -> int:
    async def attempt() -> int:
        return await store.put(key, value)
    return await eventually_async(attempt, slack(5), "etcd to take a write again",
                                  retry_on=(errors.StoreUnavailable,))


async def test_watch_loads_then_follows_puts_and_deletes_under_its_prefix(store, etcd_prefix):
    prefix = f"{etcd_prefix}/watched/".encode()
    await store.put(prefix + b"a", b"1")
    await store.put(f"{etcd_prefix}/elsewhere".encode(), b"x")
    watch = View(store, prefix, prefix=True)
    await watch.load()
    assert watch.values == {prefix + b"a": b"1"}
    watch.start()
    try:
        rev_b = await store.put(prefix + b"b", b"2")
        await store.delete(prefix + b"a")
        await store.put(f"{etcd_prefix}/elsewhere".encode(), b"y")  # not under the prefix
        rev_last = await store.put(prefix + b"b", b"3")

        async def caught_up() -> bool:
            return watch.revision >= rev_last
        await eventually_async(caught_up, slack(2), "the watch to reach the last write")
        assert watch.values == {prefix + b"b": b"3"}
        assert [(e.key, e.value) for e in watch.events] == [
            (prefix + b"b", b"2"), (prefix + b"a", None), (prefix + b"b", b"3")]
        assert watch.events[0].revision == rev_b and watch.snapshots == 1
    finally:
        await watch.stop()


@pytest.mark.timeout(120)
async def test_watch_comes_back_after_etcd_restarts_and_sees_what_changed(own_etcd):
    store = connect(own_etcd.endpoints, timeout=2.0)
    prefix = b"/agenttx-watch/policies/"
    watch = View(store, prefix, prefix=True)
    try:
        await store.put(prefix + b"kept", b"1")
        await store.put(prefix + b"gone", b"1")
        await watch.load()
        watch.start()
        await asyncio.to_thread(own_etcd.restart, 0)  # SIGKILL, then the same data dir
        assert watch.values == {prefix + b"kept": b"1", prefix + b"gone": b"1"}  # kept meanwhile

        writer = connect(own_etcd.endpoints, timeout=2.0)
        try:
            await put_when_up(writer, prefix + b"new", b"2")
            await writer.delete(prefix + b"gone")
        finally:
            await writer.close()

        async def followed() -> bool:
            return watch.values == {prefix + b"kept": b"1", prefix + b"new": b"2"}
        # Its reconnect backs off at most BACKOFF_MAX_S between tries.
        await eventually_async(followed, slack(BACKOFF_MAX_S), "the view to follow after the restart")
        assert watch.ready.is_set()
    finally:
        await watch.stop()
        await store.close()


@pytest.mark.timeout(120)
async def test_a_failing_consumer_never_leaves_a_watch_stream_open_in_etcd(own_etcd):
    store = connect(own_etcd.endpoints, timeout=2.0)
    key = b"/agenttx-watch/auth/jwks"
    watch = View(store, key, prefix=False, poison=b"poison")
    try:
        await watch.load()
        watch.start()

        async def one_watcher() -> bool:
            return await watchers(own_etcd) == 1
        await eventually_async(one_watcher, slack(2), "the watch to be created")

        # Each poison event fails the consumer: the loop drops that stream, reloads (the
        # snapshot takes any value) and watches again. Three failures, one watcher.
        for i in range(3):
            before = watch.snapshots
            await store.put(key, b"poison")

            async def reloaded(before: int = before) -> bool:
                return watch.snapshots > before
            await eventually_async(reloaded, slack(2), f"reload after failure {i + 1}")
        rev = await store.put(key, b"good")

        async def recovered() -> bool:
            return watch.revision >= rev and watch.values == {key: b"good"}
        await eventually_async(recovered, slack(2), "the watch to carry on after the failures")
        assert await watchers(own_etcd) == 1
        await watch.stop()
        await eventually_async(lambda: _zero(own_etcd), slack(2), "stop() to close the stream")
    finally:
        await watch.stop()
        await store.close()


async def _zero(etcd: EmbeddedEtcd) -> bool:
    return await watchers(etcd) == 0
