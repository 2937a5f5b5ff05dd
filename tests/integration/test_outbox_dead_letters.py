"""The dispatcher's side of dead letters, against a real etcd and real receivers (a
loopback HTTP server, a real SMTP server): which failures bury an entry and what the
burial writes, in one etcd transaction; the webhook channel's client (connection reuse,
timeouts); and DeadLetters.retry/discard's etcd state. The RPCs and the CLI on top are
pinned end to end in test_dead_letters.py.

Timings are small (lease TTL 2 s, poll 0.1 s, backoff 0.2 s doubling up to 1 s); every
wait is a condition with a deadline derived from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from agenttx.contracts.layout import Keys
from agenttx.contracts.outbox import (
    DeadLetter,
    OutboxEntry,
    decode_dead_letter,
    decode_entry,
    effect_entry,
    encode_dead_letter,
    encode_entry,
)
from agenttx.effects.channels import ChannelRegistry
from agenttx.effects.deadletters import DeadLetters
from agenttx.effects.outbox import Dispatcher, pending
from agenttx.embedded_etcd import free_port
from agenttx.store.client import Store, connect, op_put
from agenttx.testing.receivers import PostReceiver
from support.receivers import WebhookReceiver
from support.waiting import eventually_async, slack

TTL = 2
POLL_S = 0.1
FAST: dict[str, Any] = {"lease_ttl_s": TTL, "poll_interval_s": POLL_S,
                        "base_backoff_s": 0.2, "max_backoff_s": 1.0}


@pytest.fixture
async def store(etcd_endpoint: str) -> AsyncIterator[Store]:
    s = connect([etcd_endpoint])
    yield s
    await s.close()


@contextlib.asynccontextmanager
async def channels(config: dict[str, Any]) -> AsyncIterator[ChannelRegistry]:
    reg = ChannelRegistry.from_config(config)
    try:
        yield reg
    finally:
        await reg.aclose()


@contextlib.asynccontextmanager
async def running(dispatcher: Dispatcher) -> AsyncIterator[None]:
    task = asyncio.create_task(dispatcher.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def hooks(rx: PostReceiver, **more: Any) -> dict[str, Any]:
    return {"hooks": {"kind": "webhook", "url": rx.url, "timeout_s": 2, **more}}


async def commit(store: Store, prefix: str, entry: OutboxEntry) -> tuple[bytes, int, OutboxEntry]:
    """What a commit does for one entry: write it; (key, revision, entry) as it hands
    them to deliver_committed."""
    key = Keys(prefix).outbox(entry.transaction_id, entry.seq)
    res = await store.txn([], [op_put(key, encode_entry(entry))])
    return key, res.revision, entry


def claimed(channel: str, payload: Any, key: str, tx: str, seq: int = 1) -> OutboxEntry:
    return effect_entry(channel, payload, key, tx, seq, now=time.time(), claimed_by="r1",
                        claim_s=30.0)


async def letter(store: Store, prefix: str, key: str, owner: str = "") -> DeadLetter | None:
    kv = await store.get(Keys(prefix).dead_letter(owner, key))
    return decode_dead_letter(kv.value) if kv is not None else None


# ---- what buries an entry ------------------------------------------------------------------

async def test_a_poison_key_committed_before_keys_were_checked_is_buried_unsent(
        store, etcd_prefix, webhook):
    """The entry of issue 17's fuzzer: a key no HTTP header can carry, retried forever
    before. Written as the untyped codec wrote it; buried after one attempt, no request."""
    key = Keys(etcd_prefix).outbox("tx-poison", 1)
    legacy = {"channel": "hooks", "payload": {}, "idempotency_key": "\u202e",
              "transaction_id": "tx-poison", "seq": 1, "attempts": 9,
              "next_attempt_at": 0.0, "claimed_by": None, "claim_until": 0.0,
              "last_error": "UnicodeEncodeError", "created_at": time.time() - 120}
    await store.txn([], [op_put(key, json.dumps(legacy, sort_keys=True).encode())])
    async with channels(hooks(webhook)) as reg:
        d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
        async with running(d):
            dead = await eventually_async(lambda: letter(store, etcd_prefix, "\u202e"),
                                          slack(TTL + POLL_S), "the poison entry buried")
    assert webhook.requests == []
    assert dead.entry.attempts == 10  # nine before, and this one
    assert dead.entry.last_error.startswith(
        'idempotency key cannot be sent in a header: invalid value: string "\\u202e"')
    assert await store.get(key) is None
    page = await DeadLetters(store, Keys(etcd_prefix), _no_lease).list()
    assert [(d.idempotency_key, d.transaction_id, d.attempts) for d in page.letters] == [
        ("\u202e", "tx-poison", 10)]


async def _no_lease() -> int:
    return 0


@pytest.fixture
def refusing_smtp() -> Iterator[int]:
    """A real SMTP server (aiosmtpd) refusing recipients by name: `gone@` for good (550),
    `busy@` for now (451); everyone else is accepted."""
    class Handler:
        async def handle_RCPT(self, server: Any, session: Any, envelope: Any,  # noqa: N802
                              address: str, options: Any) -> str:
            if address.startswith("gone@"):
                return "550 5.1.1 mailbox unavailable"
            if address.startswith("busy@"):
                return "451 4.3.0 try again later"
            envelope.rcpt_tos.append(address)
            return "250 OK"

    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    yield port
    controller.stop()


async def test_smtp_550_is_buried_and_451_is_retried(store, etcd_prefix, refusing_smtp):
    config = {"mail": {"kind": "email", "host": "127.0.0.1", "port": refusing_smtp,
                       "from_addr": "agenttx@example.test"}}
    mail = {"subject": "s", "body": "b"}
    async with channels(config) as reg:
        d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
        gone = await commit(store, etcd_prefix,
                            claimed("mail", {**mail, "to": "gone@x.test"}, "m-gone", "tx-m", 1))
        busy = await commit(store, etcd_prefix,
                            claimed("mail", {**mail, "to": "busy@x.test"}, "m-busy", "tx-m", 2))
        delivered, errors = await d.deliver_committed([gone, busy])
    where = f"smtp://127.0.0.1:{refusing_smtp}"
    assert delivered == 0
    assert errors == [f"mail m-gone: {where} refused every recipient (550) (refused "
                      "permanently: moved to the dead letters)",
                      f"mail m-busy: {where} refused every recipient (451)"]
    dead = await letter(store, etcd_prefix, "m-gone")
    assert dead is not None and (dead.entry.attempts, dead.entry.last_error) == (
        1, f"{where} refused every recipient (550)")
    [left] = await pending(store, etcd_prefix)
    assert (left.entry.idempotency_key, left.entry.attempts) == ("m-busy", 1)


async def test_a_payload_the_channel_cannot_send_is_buried(store, etcd_prefix, webhook):
    async with channels(hooks(webhook)) as reg:
        d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
        lone = await commit(store, etcd_prefix, claimed("hooks", "\ud800", "k-lone", "tx-l"))
        delivered, [error] = await d.deliver_committed([lone])
    assert delivered == 0 and webhook.requests == []
    assert error == ("hooks k-lone: the payload cannot be encoded as UTF-8 JSON "
                     "(UnicodeEncodeError) (refused permanently: moved to the dead letters)")


async def test_a_refusal_after_transient_failures_is_buried_by_the_leader_counting_each(
        store, etcd_prefix, webhook):
    webhook.script("k-later", 503, 429, 400)
    async with channels(hooks(webhook)) as reg:
        committer = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
        written = await commit(store, etcd_prefix, claimed("hooks", 1, "k-later", "tx-b"))
        assert (await committer.deliver_committed([written]))[0] == 0
        leader = Dispatcher(store, etcd_prefix, reg, "r2", **FAST)
        async with running(leader):
            dead = await eventually_async(lambda: letter(store, etcd_prefix, "k-later"),
                                          slack(TTL + 0.2 + 0.4 + 3 * POLL_S),
                                          "buried by the background dispatcher")
            assert await pending(store, etcd_prefix) == []
    assert webhook.answers("k-later") == [503, 429, 400]
    assert dead.entry.attempts == 3
    assert dead.entry.last_error.endswith("answered HTTP 400 Bad Request")
    reservation = await store.get(Keys(etcd_prefix).effect_key("", "k-later"))
    assert reservation is not None and reservation.lease == 0  # kept while the letter waits


async def test_an_existing_dead_letter_is_never_overwritten(store, etcd_prefix, webhook):
    keys = Keys(etcd_prefix)
    older = DeadLetter(effect_entry("hooks", "old", "k-twice", "tx-old", 1, now=1.0), 2.0)
    await store.txn([], [op_put(keys.dead_letter("", "k-twice"), encode_dead_letter(older))])
    webhook.script("k-twice", 400)
    async with channels(hooks(webhook)) as reg:
        d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
        written = await commit(store, etcd_prefix, claimed("hooks", "new", "k-twice", "tx-new"))
        _, [error] = await d.deliver_committed([written])
    assert "another dead letter holds this idempotency key" in error
    assert await letter(store, etcd_prefix, "k-twice") == older
    [left] = await pending(store, etcd_prefix)
    assert (left.entry.transaction_id, left.entry.attempts) == ("tx-new", 1)
    assert "another dead letter holds this idempotency key" in left.entry.last_error


# ---- retry and discard in etcd -------------------------------------------------------------

async def test_retry_puts_the_letter_back_at_its_outbox_key_and_discard_keeps_the_key(
        store, etcd_prefix, webhook):
    keys = Keys(etcd_prefix)
    webhook.script("k-back", 400)
    webhook.script("k-gone", 400)
    leases: list[int] = []

    async def retention() -> int:
        lease, _ = await store.grant_lease(60)
        leases.append(lease)
        return lease

    letters = DeadLetters(store, keys, retention)
    async with channels(hooks(webhook)) as reg:
        d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
        back = await commit(store, etcd_prefix, claimed("hooks", {"n": 1}, "k-back", "tx-r", 4))
        gone = await commit(store, etcd_prefix, claimed("hooks", {"n": 2}, "k-gone", "tx-r", 5))
        await d.deliver_committed([back, gone])

        retried = await letters.retry("k-back")
        kv = await store.get(keys.outbox("tx-r", 4))
        assert kv is not None
        entry = decode_entry(kv.value)
        assert entry == OutboxEntry(
            kind="effect", idempotency_key="k-back", transaction_id="tx-r", seq=4,
            created_at=back[2].created_at, channel="hooks", payload={"n": 1}, attempts=1,
            next_attempt_at=entry.next_attempt_at, last_error=retried.entry.last_error)
        assert entry.is_due(time.time())
        assert await store.get(keys.dead_letter("", "k-back")) is None
        reservation = await store.get(keys.effect_key("", "k-back"))
        assert reservation is not None and reservation.lease == leases[0]
        async with running(d):
            await eventually_async(lambda: _empty(store, etcd_prefix), slack(TTL + POLL_S),
                                   "the retried entry delivered")
        assert webhook.answers("k-back") == [400, 200]

        await letters.discard("k-gone")
        assert await store.get(keys.dead_letter("", "k-gone")) is None
        reservation = await store.get(keys.effect_key("", "k-gone"))
        assert reservation is not None and reservation.lease == leases[1]
        assert json.loads(reservation.value) == {"tx": "tx-r", "step": 0, "state": "discarded"}
    assert webhook.answers("k-gone") == [400]


async def _empty(store: Store, prefix: str) -> bool:
    return not await pending(store, prefix)


# ---- the webhook channel's HTTP client ----------------------------------------------------

async def test_webhook_deliveries_reuse_one_connection(store, etcd_prefix):
    rx = WebhookReceiver()
    rx.server.RequestHandlerClass.protocol_version = "HTTP/1.1"  # keep-alive
    with rx:
        async with channels(hooks(rx)) as reg:
            d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
            written = [await commit(store, etcd_prefix, claimed("hooks", i, f"k-{i}", "tx-c", i))
                       for i in range(1, 4)]
            assert await d.deliver_committed(written) == (3, [])
    assert len({r["peer"] for r in rx.requests}) == 1


async def test_a_receiver_that_does_not_answer_times_out_and_is_retried(store, etcd_prefix):
    release = threading.Event()

    def stall(handler: BaseHTTPRequestHandler, body: bytes) -> int:
        release.wait(30)
        return 200

    with PostReceiver(stall) as rx:
        try:
            async with channels(hooks(rx, timeout_s=0.5, connect_timeout_s=1)) as reg:
                d = Dispatcher(store, etcd_prefix, reg, "r1", **FAST)
                written = await commit(store, etcd_prefix, claimed("hooks", 1, "k-slow", "tx-s"))
                started = time.monotonic()
                _, [error] = await d.deliver_committed([written])
                took = time.monotonic() - started
        finally:
            release.set()
    assert error == f"hooks k-slow: {rx.url.rsplit('/', 1)[0]} timed out after 0.5s (waiting " \
                    "for the answer)"
    assert 0.5 <= took < slack(0.5)
    [left] = await pending(store, etcd_prefix)
    assert left.entry.attempts == 1  # transient: rescheduled, not buried
