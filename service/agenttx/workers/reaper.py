"""Abort and compensate transactions idle longer than their idle timeout; reject those
whose approval timed out; sweep stray fs temp files; report how many transactions are
open and how many await approval.

A transaction awaiting approval is never idle (a person, not the agent, is to act next):
the reaper leaves it alone until its approval expires, then rejects it (REJECTED,
"approval timed out", ended by "reaper"; docs/approvals.md).

Runs on exactly one replica at a time: the holder of `<prefix>/leader/reaper` (an etcd
lease). A lease is not mutual exclusion (a paused ex-holder may wake up), so every
write the reaper makes carries the lease's fence compares in the same etcd
transaction; a replica that loses the lease stops acting before campaigning again.
When the holder dies, another replica takes over within the lease TTL.

The sweep reads transaction headers only, a page at a time (SPEC §2): its cost does not
depend on how much data open transactions hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable

from ..contracts.layout import Keys
from ..engine import sandbox
from ..engine.engine import Engine
from ..engine.state import AWAITING_APPROVAL, AWAITING_ROLLBACK, decode_header
from ..observability.metrics import METRICS
from ..store.client import Store
from ..store.lease import LeaderLease, NotLeader

log = logging.getLogger(__name__)

# A temp file older than this whose step is not pending in etcd is a leftover (a replica
# died between writing it and its step's CAS, or the CAS never applied): removed.
TEMP_MIN_AGE_S = 300.0


class Reaper:
    def __init__(self, engine: Engine, store: Store, keys: Keys, replica_id: str,
                 default_idle_timeout_s: int, *, ttl_s: int = 10,
                 interval_s: float | None = None,
                 fs_roots: Callable[[], Iterable[str]] = lambda: (),
                 temp_sweep_s: float = 600.0, temp_min_age_s: float = TEMP_MIN_AGE_S) -> None:
        self.engine, self.store, self.keys = engine, store, keys
        self.default_idle_timeout_s = default_idle_timeout_s
        self.lease = LeaderLease(store, keys.leader("reaper"), replica_id, ttl_s=ttl_s,
                                 role="reaper")
        # Often enough to expire idle transactions on time, and to refresh the history
        # leases of open ones at least every half bucket (engine.history.OpenLeases).
        self.interval_s = interval_s if interval_s is not None else min(
            5.0, max(0.2, default_idle_timeout_s / 10), engine.history_lease.bucket_s / 4)
        self.fs_roots = fs_roots
        self.temp_sweep_s = temp_sweep_s
        self.temp_min_age_s = temp_min_age_s
        self._last_temp_sweep = 0.0

    async def run(self) -> None:
        try:
            while True:
                try:
                    if await self.lease.campaign():
                        await self.sweep()
                        if time.monotonic() - self._last_temp_sweep > self.temp_sweep_s:
                            self._last_temp_sweep = time.monotonic()
                            await self.sweep_temp_files()
                    else:
                        METRICS.open_transactions.set(0)
                        METRICS.awaiting_rollback.set(0)
                        METRICS.approvals_pending.set(0)
                        METRICS.approval_oldest_age.set(0)
                except asyncio.CancelledError:
                    raise
                except NotLeader:
                    log.info("reaper lost leadership; stopping until re-elected")
                except Exception as exc:
                    log.warning("reaper sweep failed", extra={"error": f"{type(exc).__name__}: {exc}"})
                await asyncio.sleep(self.interval_s)
        finally:
            await self.lease.resign()

    async def sweep(self) -> int:
        """One pass over the transaction headers; returns how many were expired (idle, or
        their approval timed out)."""
        now = time.time()
        expired = opened = awaiting = pending = 0
        oldest = 0.0
        pinned: set[int] = set()
        timeout: float
        async for page in self.store.pages(self.keys.headers_prefix(), what="reaper scan"):
            idle: list[tuple[str, int, float]] = []
            for kv in page:
                header = decode_header(kv.value)
                opened += 1
                pinned.add(header.history_lease)
                awaiting += header.status == AWAITING_ROLLBACK
                if header.status == AWAITING_APPROVAL:
                    if header.pending is None or now < header.pending.expires_at:
                        pending += 1
                        if header.pending is not None:
                            oldest = max(oldest, now - header.pending.requested_at)
                        continue
                    if not self.lease.is_leader:
                        raise NotLeader("reaper term ended mid-sweep")
                    if await self.engine.expire_approval(header.id, kv.mod_revision,
                                                         self.lease.fence):
                        expired += 1
                        opened -= 1
                    else:
                        pending += 1
                    continue
                timeout = header.policy.idle_timeout_s or self.default_idle_timeout_s
                if now - header.updated_at >= timeout:
                    idle.append((header.id, kv.mod_revision, timeout))
            if not idle:
                continue
            touched = await self.store.get_many([self.keys.tx_touch(t) for t, _, _ in idle],
                                                what="reaper touch")
            for tx_id, rev, timeout in idle:
                mark = touched.get(self.keys.tx_touch(tx_id))
                with contextlib.suppress(ValueError):
                    if mark is not None and now - float(mark.value.decode()) < timeout:
                        continue
                if not self.lease.is_leader:
                    raise NotLeader("reaper term ended mid-sweep")
                if await self.engine.expire(tx_id, rev, self.lease.fence, timeout):
                    expired += 1
                    opened -= 1
        await self.engine.keep_history_alive(pinned)
        METRICS.open_transactions.set(opened)
        METRICS.awaiting_rollback.set(awaiting)
        METRICS.approvals_pending.set(pending)
        METRICS.approval_oldest_age.set(oldest)
        return expired

    async def sweep_temp_files(self) -> int:
        """Remove fs.write temp files whose step is gone (SPEC §3: no stray files). A
        temp file names its transaction, step and attempt; it is still needed only while
        that transaction's header marks exactly that write as pending."""
        removed = 0
        for root in dict.fromkeys(self.fs_roots()):
            found, restores = await asyncio.to_thread(_temp_files, root,
                                                      time.time() - self.temp_min_age_s)
            for path in restores:  # an undo's restore renames its temp file at once
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(os.unlink, path)
                    removed += 1
            if not found:
                continue
            headers = await self.store.get_many(
                {self.keys.tx_header(tx) for _, (tx, _, _) in found}, what="temp sweep")
            for path, (tx, step, attempt) in found:
                kv = headers.get(self.keys.tx_header(tx))
                pending = decode_header(kv.value).fs_pending if kv is not None else None
                if pending is not None and (pending.step_id, pending.attempt) == (step, attempt):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(os.unlink, path)
                    removed += 1
        if removed:
            log.info("removed stray fs temp files", extra={"count": removed})
        return removed


def _temp_files(root: str, older_than: float
                ) -> tuple[list[tuple[str, tuple[str, int, str]]], list[str]]:
    """Old fs.write temp files (with their transaction, step, attempt) and old restore
    temp files under `root`."""
    out: list[tuple[str, tuple[str, int, str]]] = []
    restores: list[str] = []
    if not os.path.isdir(root):
        return out, restores
    for directory, _, files in os.walk(root):
        for name in files:
            parsed = sandbox.parse_temp(name)
            restore = parsed is None and sandbox.is_restore_temp(name)
            if parsed is None and not restore:
                continue
            path = os.path.join(directory, name)
            try:
                if os.stat(path).st_mtime > older_than:
                    continue
            except FileNotFoundError:
                continue
            if parsed is not None:
                out.append((path, parsed))
            else:
                restores.append(path)
    return out, restores
