"""The effects outbox against a real etcd, a real HTTP receiver and a real SMTP server.

Pins SPEC §6 (at-least-once with an idempotency key, never again after a confirmed
delivery, background retry by the one replica holding the dispatcher lease) and §2's
fencing rule for leases. Timings are small (lease TTL 2 s, poll 0.1 s) so the file runs
in seconds; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agenttx.contracts.outbox import OutboxEntry, effect_entry, encode_entry
from agenttx.effects.channels import ChannelRegistry, Effect, message_id
from agenttx.effects.outbox import Dispatcher, outbox_key, pending
from agenttx.embedded_etcd import free_port
from agenttx.store.client import Store, connect, op_put
from agenttx.store.lease import LeaderLease, NotLeader
from support.receivers import WebhookReceiver

TTL = 2
FAST: dict[str, Any] = {
    "lease_ttl_s": TTL, "poll_interval_s": 0.1, "base_backoff_s": 0.2, "max_backoff_s": 1.0,
}


@pytest.fixture
async def store(etcd_endpoint: str) -> Any:
    s = connect([etcd_endpoint])
    yield s
    await s.close()


# ---- helpers ---------------------------------------------------------------------------

def registry(webhook: WebhookReceiver | None = None, **more: Any) -> ChannelRegistry:
    cfg: dict[str, Any] = dict(more)
    if webhook is not None:
        cfg["hooks"] = {"kind": "webhook", "url": webhook.url, "timeout_s": 2,
                        "headers": {"X-Team": "payments"}}
    return ChannelRegistry.from_config(cfg)


def entry_of(effect: Effect, seq: int, claimed_by: str = "") -> OutboxEntry:
    return effect_entry(effect.channel, effect.payload, effect.idempotency_key,
                        effect.transaction_id, seq, now=time.time(), claimed_by=claimed_by,
                        claim_s=30.0)


async def put_entry(store: Store, prefix: str, effect: Effect, seq: int,
                    claimed_by: str = "") -> tuple[bytes, int, OutboxEntry]:
    """What a commit txn does for one effect: write the outbox entry; return (key, rev,
    entry), what the commit hands to `deliver_committed`."""
    key = outbox_key(prefix, effect.transaction_id, seq)
    entry = entry_of(effect, seq, claimed_by)
    res = await store.txn([], [op_put(key, encode_entry(entry))])
    return key, res.revision, entry


async def wait_until(cond: Callable[[], Awaitable[bool] | bool], timeout: float,
                     what: str) -> float:
    """Poll `cond` until true; returns the elapsed seconds; fails after `timeout`."""
    start = time.monotonic()
    while True:
        got = cond()
        if not isinstance(got, bool):
            got = await got
        if got:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(*dispatchers: Dispatcher) -> Any:
    tasks = [asyncio.create_task(d.run()) for d in dispatchers]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def no_pending(store: Store, prefix: str) -> bool:
    return not await pending(store, prefix)


# ---- commit-time delivery --------------------------------------------------------------

async def test_commit_delivery_posts_exact_webhook_and_deletes_entries(
        store, etcd_prefix, webhook, caplog):
    caplog.set_level(logging.INFO, logger="agenttx.effects")
    d = Dispatcher(store, etcd_prefix, registry(webhook), "r1", **FAST)
    hook = Effect("hooks", {"order": 42, "items": ["a", "b"]}, "tx1-order-42", "tx1")
    audit = Effect("log", {"note": "shipped"}, "tx1-audit", "tx1")
    entries = [await put_entry(store, etcd_prefix, eff, seq, claimed_by="r1")
               for seq, eff in enumerate([audit, hook])]

    assert await d.deliver_committed(entries) == (2, [])

    [req] = webhook.requests
    assert req["path"] == "/in"
    assert json.loads(req["body"]) == {"channel": "hooks", "payload": {"order": 42,
                                       "items": ["a", "b"]}, "idempotency_key": "tx1-order-42",
                                       "transaction_id": "tx1"}
    assert req["headers"]["Idempotency-Key"] == "tx1-order-42"
    assert req["headers"]["Content-Type"] == "application/json"
    assert req["headers"]["X-Team"] == "payments"
    logged = [r for r in caplog.records if getattr(r, "idempotency_key", None) == "tx1-audit"
              and getattr(r, "channel", None) == "log"]
    assert logged and logged[0].payload == {"note": "shipped"}
    assert await pending(store, etcd_prefix) == []


async def test_commit_delivery_failure_is_reported_and_rescheduled(store, etcd_prefix, webhook):
    webhook.status = 503
    d = Dispatcher(store, etcd_prefix, registry(webhook), "r1", **FAST)
    written = await put_entry(store, etcd_prefix, Effect("hooks", {"x": 1}, "k-503", "tx2"), 0,
                              claimed_by="r1")
    before = time.time()

    delivered, errors = await d.deliver_committed([written])

    assert delivered == 0
    assert errors == [f"hooks k-503: {webhook.url.rsplit('/', 1)[0]} answered HTTP 503 "
                      "Service Unavailable"]
    [left] = await pending(store, etcd_prefix)
    entry = left.entry
    assert entry.attempts == 1 and entry.claimed_by == ""
    assert entry.next_attempt_at > before
    assert "HTTP 503" in entry.last_error


async def test_commit_delivery_unreachable_receiver_is_reported(store, etcd_prefix):
    reg = ChannelRegistry.from_config(
        {"hooks": {"kind": "webhook", "url": f"http://127.0.0.1:{free_port()}/", "timeout_s": 1}})
    d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
    written = await put_entry(store, etcd_prefix, Effect("hooks", 1, "k-refused", "tx"), 0, "r1")
    delivered, [error] = await d.deliver_committed([written])
    assert delivered == 0 and error.startswith("hooks k-refused: ")
    assert "refused the connection" in error


async def test_email_arrives_with_message_id_from_idempotency_key(store, etcd_prefix, smtp):
    sink, port = smtp
    reg = ChannelRegistry.from_config(
        {"mail": {"kind": "email", "host": "127.0.0.1", "port": port,
                  "from_addr": "agenttx@example.com"}})
    d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
    eff = Effect("mail", {"to": ["ops@example.com", "cto@example.com"], "subject": "Refund done",
                          "body": "Order 42 refunded.\n"}, "tx3-mail-1", "tx3")
    written = await put_entry(store, etcd_prefix, eff, 0, "r1")

    assert await d.deliver_committed([written]) == (1, [])

    [env] = sink.envelopes
    assert env.mail_from == "agenttx@example.com"
    assert env.rcpt_tos == ["ops@example.com", "cto@example.com"]
    msg = email.message_from_bytes(env.original_content, policy=email.policy.default)
    assert msg["To"] == "ops@example.com, cto@example.com"
    assert msg["Subject"] == "Refund done"
    assert msg["Message-ID"] == message_id("tx3-mail-1")
    assert msg["X-Idempotency-Key"] == "tx3-mail-1"
    assert msg.get_content().replace("\r\n", "\n") == "Order 42 refunded.\n"  # SMTP: CRLF
    assert await pending(store, etcd_prefix) == []


# ---- background dispatcher -------------------------------------------------------------

async def test_background_retry_delivers_once_after_receiver_recovers(
        store, etcd_prefix, webhook):
    webhook.status = 500
    reg = registry(webhook)
    committer = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
    written = await put_entry(store, etcd_prefix, Effect("hooks", {"n": 1}, "k-retry", "tx4"),
                              0, "r1")
    assert (await committer.deliver_committed([written]))[0] == 0
    webhook.status = 200

    async with running(Dispatcher(store, etcd_prefix, reg, "r2", **FAST)):
        await wait_until(lambda: no_pending(store, etcd_prefix), 5, "the retry")
        await asyncio.sleep(0.5)  # a few more sweeps: nothing more may be sent

    assert webhook.keys() == Counter({"k-retry": 2})  # the failed attempt + one delivery
    assert [r["headers"]["Idempotency-Key"] for r in webhook.requests] == ["k-retry"] * 2


async def test_background_leaves_a_commit_claimed_entry_alone(store, etcd_prefix, webhook):
    reg = registry(webhook)
    written = await put_entry(store, etcd_prefix, Effect("hooks", 1, "k-claimed", "tx5"), 0,
                              claimed_by="r1")
    async with running(Dispatcher(store, etcd_prefix, reg, "r2", **FAST)) as _:
        await asyncio.sleep(0.6)
        assert webhook.requests == []
        assert await Dispatcher(store, etcd_prefix, reg, "r1", **FAST).deliver_committed(
            [written]) == (1, [])
        await asyncio.sleep(0.3)
    assert webhook.keys() == Counter({"k-claimed": 1})


async def test_two_dispatchers_deliver_each_entry_once(store, etcd_prefix, webhook):
    reg = registry(webhook)
    a = Dispatcher(store, etcd_prefix, reg, "replica-a", **FAST)
    b = Dispatcher(store, etcd_prefix, reg, "replica-b", **FAST)
    keys = [f"tx{t}-{s}" for t in range(4) for s in range(5)]
    async with running(a, b):
        for i, k in enumerate(keys):
            await put_entry(store, etcd_prefix, Effect("hooks", {"i": i}, k, k.split("-")[0]),
                            i)
        await wait_until(lambda: no_pending(store, etcd_prefix), 10, "all deliveries")
        assert a.is_leader != b.is_leader
        await asyncio.sleep(0.3)
    assert webhook.keys() == Counter({k: 1 for k in keys})


async def test_revoked_dispatcher_stops_acting_and_the_other_takes_over(
        store, etcd_prefix, webhook):
    reg = registry(webhook)
    a = Dispatcher(store, etcd_prefix, reg, "replica-a", **FAST)
    b = Dispatcher(store, etcd_prefix, reg, "replica-b", **FAST)
    sent_by: list[str] = []

    def tracking(name: str) -> Callable[[bytes, OutboxEntry], Awaitable[None]]:
        async def hook(key: bytes, entry: OutboxEntry) -> None:
            sent_by.append(name)
        return hook

    a.after_delivery, b.after_delivery = tracking("a"), tracking("b")
    async with running(a):
        await wait_until(lambda: a.is_leader, 3, "a to lead")
        stale_fence = a.lease.fence()
        async with running(b):
            await store.revoke_lease(a.lease.lease_id)
            # The ex-holder's fence is dead in etcd at once, whatever a believes locally.
            probe = f"{etcd_prefix}/probe".encode()
            assert not (await store.txn(stale_fence, [op_put(probe, b"x")])).succeeded
            assert await store.get(probe) is None

            took = await wait_until(lambda: b.is_leader, TTL, "b to take over")
            assert took < TTL
            await wait_until(lambda: not a.is_leader, TTL, "a to notice")
            for i in range(3):
                await put_entry(store, etcd_prefix, Effect("hooks", i, f"k-{i}", "tx6"), i)
            await wait_until(lambda: no_pending(store, etcd_prefix), 5, "b's deliveries")
    assert sent_by == ["b", "b", "b"]
    assert webhook.keys() == Counter({"k-0": 1, "k-1": 1, "k-2": 1})


async def test_crash_between_delivery_and_delete_redelivers_at_most_once(
        store, etcd_prefix, webhook):
    reg = registry(webhook)
    # Short claim so the survivor may take the crashed replica's claim over quickly.
    a = Dispatcher(store, etcd_prefix, reg, "replica-a", **FAST, claim_s=1.0)
    b = Dispatcher(store, etcd_prefix, reg, "replica-b", **FAST, claim_s=1.0)
    delivered_by_a = asyncio.Event()

    async def crash_point(key: bytes, entry: OutboxEntry) -> None:
        delivered_by_a.set()
        await asyncio.Event().wait()  # "dies" here: cancelled before the delete

    a.after_delivery = crash_point
    async with running(a) as [task_a]:
        await wait_until(lambda: a.is_leader, 3, "a to lead")
        async with running(b):
            await put_entry(store, etcd_prefix, Effect("hooks", {"n": 7}, "k-crash", "tx7"), 0)
            await asyncio.wait_for(delivered_by_a.wait(), 5)
            task_a.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task_a
            assert webhook.keys() == Counter({"k-crash": 1})

            await wait_until(lambda: no_pending(store, etcd_prefix), 5, "b's redelivery")
            await asyncio.sleep(1.0)  # confirmed deletion: never sent again
    assert webhook.keys() == Counter({"k-crash": 2})
    assert [json.loads(r["body"]) for r in webhook.requests] == [
        {"channel": "hooks", "payload": {"n": 7}, "idempotency_key": "k-crash",
         "transaction_id": "tx7"}] * 2


# ---- the leader lease itself -------------------------------------------------------------

async def test_lease_holder_stops_acting_before_another_can_acquire(store, etcd_prefix):
    key = f"{etcd_prefix}/leader/reaper".encode()
    first = LeaderLease(store, key, "replica-a", ttl_s=TTL)
    second = LeaderLease(store, key, "replica-b", ttl_s=TTL)
    try:
        assert await first.campaign()
        assert await first.campaign()  # idempotent while held
        assert not await second.campaign()
        fence = first.fence()
        probe = f"{etcd_prefix}/probe".encode()
        assert (await first.fenced_txn([], [op_put(probe, b"1")])).succeeded

        # "Pause" the holder: its keepalives stop, as in a GC stall or a frozen VM.
        assert first._keepalive_task is not None
        first._keepalive_task.cancel()
        await wait_until(lambda: not first.is_leader, TTL + 1, "local deadline")
        # It stopped acting while etcd still holds its key: nobody else can lead yet.
        held = await store.get(key)
        assert held is not None and held.value == b"replica-a"
        with pytest.raises(NotLeader):
            first.fence()

        async def second_wins() -> bool:
            return await second.campaign()

        await wait_until(second_wins, TTL + 3, "etcd to expire the lease")
        assert not (await store.txn(fence, [op_put(probe, b"stale")])).succeeded
        assert (await store.get(probe)).value == b"1"
        assert (await second.fenced_txn([], [op_put(probe, b"2")])).succeeded

        await second.resign()
        assert not second.is_leader
        assert await first.campaign()  # released at once, no TTL wait
        with pytest.raises(NotLeader):
            await second.fenced_txn([], [op_put(probe, b"3")])
    finally:
        await first.resign()
        await second.resign()
