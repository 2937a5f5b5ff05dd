"""Abort and compensate transactions idle longer than their idle timeout.

Runs on exactly one replica at a time: the holder of `<prefix>/leader/reaper` (an etcd
lease). A lease is not mutual exclusion (a paused ex-holder may wake up), so every
write the reaper makes carries the lease's fence compares in the same etcd
transaction; a replica that loses the lease stops acting before campaigning again.
When the holder dies, another replica takes over within the lease TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..store.client import Store
from ..store.layout import Keys
from ..store.lease import LeaderLease, NotLeader
from .model import from_json
from .transactions import Engine

log = logging.getLogger(__name__)


class Reaper:
    def __init__(self, engine: Engine, store: Store, keys: Keys, replica_id: str,
                 default_idle_timeout_s: int, *, ttl_s: int = 10,
                 interval_s: float | None = None) -> None:
        self.engine, self.store, self.keys = engine, store, keys
        self.default_idle_timeout_s = default_idle_timeout_s
        self.lease = LeaderLease(store, keys.leader("reaper"), replica_id, ttl_s=ttl_s)
        self.interval_s = interval_s if interval_s is not None else min(
            5.0, max(0.2, default_idle_timeout_s / 10))

    async def run(self) -> None:
        try:
            while True:
                try:
                    if await self.lease.campaign():
                        await self.sweep()
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
        """One pass over all transactions; returns how many were expired."""
        prefix = self.keys.all_tx_prefix()
        res = await self.store.read(prefixes=[prefix], what="reaper scan")
        headers: dict[str, tuple[dict, int]] = {}
        touched: dict[str, float] = {}
        for kv in res.ranges[prefix]:
            parts = kv.key[len(prefix):].decode().split("/")
            if len(parts) == 2 and parts[1] == "header":
                headers[parts[0]] = (from_json(kv.value), kv.mod_revision)
            elif len(parts) == 2 and parts[1] == "touch":
                try:
                    touched[parts[0]] = float(kv.value.decode())
                except ValueError:
                    pass
        now = time.time()
        expired = 0
        for tx_id, (header, rev) in headers.items():
            timeout = header.get("policy", {}).get("idle_timeout_s") or self.default_idle_timeout_s
            last = max(header.get("updated_at", 0.0), touched.get(tx_id, 0.0))
            if now - last < timeout:
                continue
            if not self.lease.is_leader:
                raise NotLeader("reaper term ended mid-sweep")
            if await self.engine.expire(tx_id, rev, self.lease.fence):
                expired += 1
        return expired
