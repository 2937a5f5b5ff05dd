"""GetServiceStatus: how many transactions are open, effects wait and letters lie dead.

Why counts only: a status display (the console's status strip, docs/console.md) is
refreshed every few seconds by every person looking at it, so it must never carry what
the deployment holds. Each number is one etcd range read with `count_only` (etcd counts
the keys in its index and answers with the number alone, never a key or a value), the
three sent at once: one round trip's latency, a few bytes each.

What it must never do: read values, or fail because etcd is unreachable. A display that
errors exactly when etcd is down hides the one thing it should show; instead the answer
says `etcd_reachable = false` and carries no counts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..contracts.layout import Keys
from ..errors import StoreUnavailable
from ..store.ops import KeyValueStore


@dataclass(frozen=True)
class ServiceCounts:
    etcd_reachable: bool
    open_transactions: int = 0
    outbox_depth: int = 0
    dead_letters: int = 0
    approvals_pending: int = 0


async def read_counts(store: KeyValueStore, keys: Keys) -> ServiceCounts:
    """The deployment's counts (every principal's: a count names no transaction). Open
    transactions are their headers (`txh/`, deleted when a transaction ends); the outbox
    depth is its entries (one key per committed effect or deferred call not yet
    delivered); dead letters one key each. Approvals pending are counted once approvals
    keep an index of their own (docs/console.md, "Status strip")."""
    try:
        open_txs, outbox, dead = await asyncio.gather(
            store.count(keys.headers_prefix(), what="status"),
            store.count(keys.outbox_prefix(), what="status"),
            store.count(keys.dead_letters_prefix(), what="status"))
    except StoreUnavailable:
        return ServiceCounts(etcd_reachable=False)
    return ServiceCounts(True, open_txs, outbox, dead)


__all__ = ["ServiceCounts", "read_counts"]
