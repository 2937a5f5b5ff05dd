"""The store's one lease keeper (`agenttx.store.lease.LeaseKeeper`) against a real etcd:
a kept lease outlives its TTL, a lost presence lease is replaced and its key put back,
stop revokes, and a failed acquire leaves nothing behind. (The leader's use of it, with
fencing, is pinned in test_effects.py.)"""

from __future__ import annotations

import asyncio

import pytest

from agenttx.contracts.layout import Keys
from agenttx.server import replica_presence
from agenttx.store.lease import LeaseKeeper
from support.waiting import eventually_async, slack

TTL = 1  # etcd's smallest lease TTL; a keeper refreshes every third of it


async def test_a_kept_lease_outlives_its_ttl_and_stop_revokes_it(store, etcd_prefix):
    key = f"{etcd_prefix}/kept".encode()

    async def attach(lease_id: int) -> bool:
        await store.put(key, b"alive", lease=lease_id)
        return True

    keeper = LeaseKeeper(store, TTL, what="test lease", attach=attach)
    assert await keeper.acquire()
    lease_id = keeper.lease_id
    keeper.start()
    try:
        # Nothing to wait for but time itself: three TTLs without the key expiring.
        await asyncio.sleep(3 * TTL)
        held = await store.get(key)
        assert held is not None and held.lease == lease_id and keeper.valid
    finally:
        await keeper.stop()
    assert await store.get(key) is None  # revoked at once, not expired a TTL later
    assert keeper.lease_id is None and not keeper.valid


async def test_presence_goes_back_on_a_new_lease_after_its_lease_is_revoked(store, etcd_prefix):
    keys = Keys(etcd_prefix)
    presence = replica_presence(store, keys, "replica-x", ttl_s=2)
    assert await presence.acquire()
    first = presence.lease_id
    assert first is not None
    presence.start()
    try:
        await store.revoke_lease(first)  # as if etcd had expired it during a stall
        assert await store.get(keys.replica("replica-x")) is None

        async def back() -> bool:
            kv = await store.get(keys.replica("replica-x"))
            return kv is not None and kv.value == b"alive" and kv.lease not in (0, first)
        # Noticed at the next refresh (a third of the TTL), then granted and put again.
        await eventually_async(back, slack(2), "the presence key to come back on a new lease")
        assert presence.lease_id not in (None, first)
    finally:
        await presence.stop()
    assert await store.get(keys.replica("replica-x")) is None


async def test_a_failed_acquire_leaves_no_lease_and_no_key_behind(store, etcd_prefix):
    key = f"{etcd_prefix}/half".encode()

    async def attach_then_fail(lease_id: int) -> bool:
        await store.put(key, b"x", lease=lease_id)
        raise RuntimeError("the caller's second write failed")

    keeper = LeaseKeeper(store, 5, what="test lease", attach=attach_then_fail)
    with pytest.raises(RuntimeError, match="second write failed"):
        await keeper.acquire()
    assert await store.get(key) is None  # the lease was revoked, taking the key with it
    assert keeper.lease_id is None

    async def refuse(lease_id: int) -> bool:
        await store.put(key, b"y", lease=lease_id)
        return False  # e.g. someone else leads: give the lease back

    keeper = LeaseKeeper(store, 5, what="test lease", attach=refuse)
    assert not await keeper.acquire()
    assert await store.get(key) is None and keeper.lease_id is None
