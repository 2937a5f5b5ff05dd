"""The one etcd watch loop: a local view of one key or one prefix, kept current.

Why one loop: the service follows what the operator publishes (policies, the
service-account issuer keys) by watching etcd, and the two hand-written copies of this
loop drifted apart (only one cancelled its stream on error). Here, once:

* load: ONE read of the key or prefix, handed over whole (`on_snapshot(kvs, revision)`),
  then a watch from the revision after it; every event is handed over in order as a
  `WatchEvent` (`value` None for a delete);
* on any interruption (etcd restarted, the channel dropped, aetcd cancelled its own
  stream reader, the stream ended, the revision was compacted) the stream is cancelled,
  the loop backs off (0.5 s doubling to 10 s; reset by a successful load) and reconnects:
  it loads again and resumes watching from the revision of that load. Reloading costs one
  read per interruption and is what makes the view right whatever was missed, even when
  etcd came back from a snapshot with older revisions, where resuming from a remembered
  revision would wait for events that never come.

What it must never do: stop following because etcd misbehaved (only `stop()` ends it),
leave a watch stream open after an error, or swallow the caller's cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from ..tasks import BackgroundTasks
from .client import Store
from .ops import KeyValue, WatchEvent, op_get, op_get_prefix, prefix_end

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
# How long cancelling a broken stream may take before it is abandoned (a stream on a dead
# channel never answers its cancel).
CANCEL_TIMEOUT_S = 2.0


class Watch:
    """A view of `key` (or of every key under it, with `prefix=True`) kept current.

    Subclasses are the views: `on_snapshot(kvs, revision)` receives the whole current
    state after every (re)load, `on_event(event)` each change after it. Both run in the
    watch task and must not block. `ready` is set after the first successful load and
    stays set: the view is the last good one, even while the watch is re-established.
    """

    def __init__(self, store: Store, key: bytes, *, prefix: bool, what: str) -> None:
        self._store = store
        self.key = key
        self.prefix = prefix
        self.what = what
        self.revision = 0  # the last revision handed over (load or event)
        self.ready = asyncio.Event()
        self._need_load = True
        self._tasks = BackgroundTasks(f"watch {what}")

    def on_snapshot(self, kvs: Sequence[KeyValue], revision: int) -> None:
        raise NotImplementedError

    def on_event(self, event: WatchEvent) -> None:
        raise NotImplementedError

    async def load(self) -> None:
        """Read the current state (one round trip) and hand it to `on_snapshot`.
        Raises StoreError / StoreUnavailable when etcd cannot be read."""
        op = op_get_prefix(self.key) if self.prefix else op_get(self.key)
        res = await self._store.read([op], what=f"{self.what} load")
        self.on_snapshot(res.kvs(0), res.revision)
        self.revision = res.revision
        self._need_load = False
        self.ready.set()

    def start(self) -> None:
        self._tasks.start(self._run(), name=f"watch:{self.what}")

    async def stop(self) -> None:
        await self._tasks.stop()

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST_S
        while True:
            try:
                if self._need_load:
                    await self.load()
                    backoff = BACKOFF_FIRST_S
                await self._follow()
                reason = "the watch stream ended"  # etcd cancelled it (e.g. compaction)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being stopped
                # aetcd cancels its own stream reader when its channel goes away: an
                # interrupted watch, not a reason to stop watching.
                reason = "the watch stream was cancelled"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            self._need_load = True
            log.warning("watch interrupted; reloading",
                        extra={"watch": self.what, "key": self.key.decode(errors="replace"),
                               "reason": reason, "revision": self.revision,
                               "retry_in_s": backoff})
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _follow(self) -> None:
        """One watch stream from the revision after `revision` until it ends or fails;
        the stream is cancelled whichever way it ends."""
        range_end = prefix_end(self.key) if self.prefix else None
        stream = await self._store.watch(self.key, range_end=range_end,
                                         start_revision=self.revision + 1,
                                         what=f"{self.what} watch")
        try:
            async for event in stream:
                self.on_event(event)
                self.revision = max(self.revision, event.revision)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stream.cancel(), CANCEL_TIMEOUT_S)


__all__ = ["Watch", "WatchEvent"]
