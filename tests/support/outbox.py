"""Read a replica's outbox from etcd: what proves that nothing more will be delivered.

A committed effect is deleted from the outbox once its delivery was confirmed, and only an
entry in the outbox is ever sent (docs/architecture.md#effects-staged-in-a-step-sent-after-commit).
So "the outbox is empty" is the condition that proves no further delivery can come, where
a test would otherwise sleep and check that nothing more arrived.
"""

from __future__ import annotations

import asyncio

from agenttx.contracts.layout import Keys
from agenttx.store.client import connect
from agenttx.testing import ServiceProcess


def outbox_size(svc: ServiceProcess) -> int:
    """Entries in the outbox of `svc`'s deployment (its etcd prefix)."""
    async def read() -> int:
        store = connect(svc.etcd_endpoints, timeout=5)
        try:
            return len(await store.get_prefix(Keys(svc.prefix).outbox_prefix()))
        finally:
            await store.close()
    return asyncio.run(read())


def outbox_is_empty(svc: ServiceProcess) -> bool:
    return outbox_size(svc) == 0
