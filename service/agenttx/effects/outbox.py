"""The durable effects outbox and its dispatcher: at-least-once, never after a confirmed send.

Why this module exists: a committed effect must reach its receiver even if the replica
that committed it dies a moment later, and it must never be sent again once its
delivery was confirmed (docs/operations.md, "Outbox backlog"). So the commit writes each
effect as a typed outbox entry (contracts.outbox) in the same etcd transaction as the
data, then:

* the committing replica delivers right away (`Dispatcher.deliver_committed`); the entry
  is created *claimed* by that replica for `claim_s` seconds so the background loop
  leaves it alone meanwhile;
* whatever is left (receiver down, replica died) is retried by `Dispatcher.run` on the
  one replica holding the dispatcher lease (`P/leader/dispatcher`), with exponential
  backoff and full jitter.

Entry lifecycle, every step a compare-and-swap on the entry's mod_revision:

    due & unclaimed --claim (fenced)--> claimed by me --deliver--> ok:        delete
                                                                   transient: reschedule
                                                                              (fenced)
                                                                   permanent: bury
                                                                              (fenced)

A permanent refusal (effects.delivery: HTTP 4xx other than 408/425/429, SMTP 5xx, a
payload or key the channel cannot encode) is never retried: ONE etcd transaction deletes
the entry, writes it to `<prefix>/deadletters/<owner>/<key>` with the last error, the
attempt count (every attempt, the commit-time one included) and the time, and keeps the
idempotency key reserved (no lease) while the letter exists, so no other effect can take
the key meanwhile. Admins list, retry or discard dead letters (effects.deadletters). A
transient failure is retried with backoff forever; it never becomes a dead letter.

Guarantees and their price:

* A confirmed delivery is followed by a delete guarded by the claim's mod_revision; once
  that delete is acknowledged the entry does not exist, so nobody can send it again.
* Lost etcd between "receiver confirmed" and "delete acknowledged" does not cause a
  re-send: the confirming replica keeps the entry in its `confirmed` set, never delivers
  it again, and retires it as soon as etcd answers (first thing in every loop pass, on
  every replica, leader or not). Meanwhile the leader leaves entries claimed by another
  replica alone for `recovery_grace_s` after any etcd error of its own, so the claimer
  retires them before their claims are considered expired.
* The one residual window: the confirming replica dies after the receiver confirmed and
  before the delete is acknowledged. Its claim then expires and the entry is delivered
  again with the same idempotency key: at-least-once, the receiver dedupes. This window
  cannot be closed without the receiver's cooperation; it is kept to one etcd round
  trip (plus the outage, if etcd is unreachable at that moment).
* Claims and reschedules made by the background loop carry the leader-lease fence
  (store.lease), so a paused ex-leader cannot start sending after another replica took
  over. The post-delivery delete deliberately carries only the claim's mod_revision:
  that revision is itself a fencing token (anyone who took the entry over changed it),
  and failing the delete because the *lease* lapsed would only force a needless
  redelivery of something already delivered.
* Claim expiry compares wall clocks (`claim_until`, unix seconds) across replicas;
  clock skew larger than `claim_s` minus the delivery timeout can cause a duplicate
  delivery, never a lost one.

Effects are attempted in key order (transaction, seq); once a retry intervenes there is
no ordering guarantee between effects. An entry is retried until delivered or refused
for good (no attempt cap: dropping a committed effect would break the contract);
`pending()` shows them.

Entries are routed by `kind`: `effect` to the configured channels, `deferred` (a toolset
call staged at step time) to the `deferred` delivery the server wires in; a kind this
replica cannot deliver is a transient failure, never a loss.

What it must never do: deliver an entry it could not claim, raise a delivery failure to
the commit path, delete an entry whose delivery was not confirmed, or retry one its
receiver refused for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..contracts.layout import Keys
from ..contracts.outbox import (
    KIND_DEFERRED,
    KIND_EFFECT,
    DeadLetter,
    OutboxEntry,
    decode_entry,
    encode_dead_letter,
    encode_entry,
    reservation_value,
)
from ..errors import StoreError, StoreUnavailable
from ..observability.metrics import METRICS
from ..store.client import (
    KeyValue,
    Op,
    Store,
    cmp_absent,
    cmp_mod,
    op_delete,
    op_get,
    op_put,
)
from ..store.lease import LeaderLease, NotLeader
from .channels import ChannelRegistry, Effect
from .delivery import DeliveryError

log = logging.getLogger("agenttx.effects")

# A delete after a confirmed delivery is retried this many times on a transient etcd
# error (safe: it is guarded by the claim's mod_revision) to keep the redelivery window
# small.
_DELETE_ATTEMPTS = 3

# How a deferred toolset call is delivered (wired in by the server; raises DeliveryError).
DeferredDelivery = Callable[[OutboxEntry], Awaitable[None]]


def outbox_prefix(prefix: str) -> bytes:
    return Keys(prefix).outbox_prefix()


def outbox_key(prefix: str, tx_id: str, seq: int) -> bytes:
    return Keys(prefix).outbox(tx_id, seq)


def leader_key(prefix: str) -> bytes:
    return Keys(prefix).leader("dispatcher")


def _decode(kv: KeyValue) -> OutboxEntry | None:
    try:
        return decode_entry(kv.value)
    except ValueError as exc:
        log.error("outbox entry unreadable, left in place",
                  extra={"key": kv.key.decode(errors="replace"), "error": str(exc)})
        return None


@dataclass(frozen=True)
class Pending:
    """An outbox entry as read back: its key, mod_revision and record."""

    key: str
    mod_revision: int
    entry: OutboxEntry


async def pending(store: Store, prefix: str) -> list[Pending]:
    """Every readable outbox entry (delivered entries are deleted, so: everything not yet
    confirmed), in key order."""
    out = []
    for kv in await store.get_prefix(outbox_prefix(prefix)):
        entry = _decode(kv)
        if entry is not None:
            out.append(Pending(kv.key.decode(), kv.mod_revision, entry))
    return out


class Dispatcher:
    """Delivers outbox entries: right after a commit, and in the background as leader."""

    def __init__(self, store: Store, prefix: str, registry: ChannelRegistry, replica_id: str,
                 *, lease_ttl_s: int = 10, poll_interval_s: float = 1.0,
                 base_backoff_s: float = 0.5, max_backoff_s: float = 60.0,
                 claim_s: float = 30.0, delivery_timeout_s: float | None = None,
                 recovery_grace_s: float | None = None,
                 deferred: DeferredDelivery | None = None) -> None:
        self.store = store
        self.keys = Keys(prefix)
        self.prefix = self.keys.prefix
        self.registry = registry
        self.deferred = deferred
        self.replica_id = replica_id
        self.lease_ttl_s = lease_ttl_s
        self.poll_interval_s = poll_interval_s
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.claim_s = claim_s
        # A delivery must end well inside its claim, or another replica may take the
        # entry over and send it concurrently.
        self.delivery_timeout_s = delivery_timeout_s if delivery_timeout_s else claim_s / 2
        if self.delivery_timeout_s >= claim_s:
            raise ValueError("delivery_timeout_s must be shorter than claim_s")
        self.lease = LeaderLease(store, leader_key(self.prefix), replica_id, lease_ttl_s,
                                 role="dispatcher")
        # Delivered and confirmed, but the outbox entry could not be deleted yet (etcd
        # unreachable): key -> claim revision. Never delivered again from here.
        self.confirmed: dict[bytes, int] = {}
        self.recovery_grace_s = recovery_grace_s if recovery_grace_s is not None else \
            max(5.0, 5 * poll_interval_s)
        self._etcd_error_at = 0.0
        # Test hook: awaited after a confirmed delivery and before the entry is deleted
        # (lets a test "crash" the dispatcher inside the redelivery window).
        self.after_delivery: Callable[[bytes, OutboxEntry], Awaitable[None]] | None = None

    # ---- commit-time path --------------------------------------------------------------

    async def deliver_committed(self, entries: Sequence[tuple[bytes, int, OutboxEntry]]
                                ) -> tuple[int, list[str]]:
        """Deliver the entries a commit txn just wrote: (key, the commit's revision, the
        entry as written, claimed by this replica). Nothing is read back or decoded.

        Returns (delivered count, ["<target> <idempotency_key>: <reason>", ...]).
        Never raises for a delivery or etcd failure: whatever is not delivered stays in
        the outbox for the background loop (or, refused for good, is a dead letter).
        """
        delivered, errors = 0, []
        for key, rev, entry in sorted(entries, key=lambda e: e[0]):
            if key in self.confirmed:
                continue
            ok, error = await self._attempt(key, rev, entry, fenced=None)
            delivered += ok
            if error:
                errors.append(f"{entry.target} {entry.idempotency_key}: {error}")
        return delivered, errors

    # ---- background loop ---------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.lease.is_leader

    async def run(self) -> None:
        """Campaign for the dispatcher lease and, while leader, drain due entries.

        Runs until cancelled; resigns the lease on the way out. etcd outages are logged
        and retried every poll interval; the loop never dies of them.
        """
        log.info("outbox dispatcher started",
                 extra={"replica": self.replica_id, "prefix": self.prefix})
        try:
            while True:
                busy = False
                try:
                    await self.retire_confirmed()
                    if not self.lease.is_leader and await self.lease.campaign():
                        log.info("outbox dispatcher leading", extra={"replica": self.replica_id})
                    if self.lease.is_leader:
                        busy = await self._sweep()
                    else:  # leader-reported gauges: 0 elsewhere (dashboards take the max)
                        METRICS.outbox_depth.set(0)
                        METRICS.outbox_oldest_age.set(0)
                        METRICS.dead_letters.set(0)
                except NotLeader as exc:
                    log.warning("outbox dispatcher stopped acting",
                                extra={"replica": self.replica_id, "error": str(exc)})
                except StoreError as exc:
                    self._etcd_error_at = time.monotonic()
                    log.warning("outbox dispatcher etcd error",
                                extra={"replica": self.replica_id, "error": str(exc)})
                except Exception:  # a bug: keep the loop alive, but loudly
                    log.exception("outbox dispatcher iteration failed",
                                  extra={"replica": self.replica_id})
                if not busy:
                    await asyncio.sleep(self.poll_interval_s)
                else:
                    await asyncio.sleep(0)
        finally:
            with contextlib.suppress(Exception):
                await self.lease.resign()
            log.info("outbox dispatcher stopped", extra={"replica": self.replica_id})

    async def retire_confirmed(self) -> int:
        """Delete the entries of deliveries this replica confirmed but could not retire
        (etcd was unreachable). The outbox key names one committed effect forever, and
        that effect was delivered, so the delete needs no compare. Returns how many."""
        retired = 0
        for key in list(self.confirmed):
            try:
                await self.store.txn([], [op_delete(key)], what="outbox retire")
            except StoreError:
                self._etcd_error_at = time.monotonic()
                return retired
            self.confirmed.pop(key, None)
            retired += 1
            log.info("retired a delivered effect after etcd returned",
                     extra={"key": key.decode(errors="replace"), "replica": self.replica_id})
        return retired

    async def _sweep(self) -> bool:
        """One pass over the outbox, a page at a time. True if anything was attempted.
        Also reports the dead letters' count (one count-only read per pass)."""
        now = time.time()
        attempted = False
        depth, oldest = 0, 0.0
        recovering = time.monotonic() - self._etcd_error_at < self.recovery_grace_s
        # an entry carries its effect's payload (up to 1 MiB of arguments): small pages
        async for page in self.store.pages(outbox_prefix(self.prefix), page_size=16,
                                           what="outbox scan"):
            for kv in page:
                if not self.lease.is_leader:
                    return attempted
                entry = _decode(kv)
                depth += 1
                if entry is not None:
                    oldest = max(oldest, now - (entry.created_at or now))
                if entry is None or kv.key in self.confirmed or not entry.is_due(now):
                    continue
                if recovering and entry.claimed_by not in ("", self.replica_id):
                    continue  # its claimer may hold a confirmed delivery: let it retire first
                attempted |= await self._claim_and_attempt(kv, entry)
        METRICS.outbox_depth.set(depth)
        METRICS.outbox_oldest_age.set(oldest)
        METRICS.dead_letters.set(await self.store.count(self.keys.dead_letters_prefix(),
                                                        what="outbox dead letters"))
        return attempted

    async def _claim_and_attempt(self, kv: KeyValue, entry: OutboxEntry) -> bool:
        claimed = entry.claimed(self.replica_id, time.time() + self.claim_s)
        res = await self.lease.fenced_txn(
            [cmp_mod(kv.key, kv.mod_revision)], [op_put(kv.key, encode_entry(claimed))],
            what="outbox claim",
        )
        if not res.succeeded:
            return False  # changed under us (delivered at commit time, or rescheduled)
        await self._attempt(kv.key, res.revision, claimed, fenced=self.lease)
        return True

    # ---- one delivery ------------------------------------------------------------------

    def _label(self, entry: OutboxEntry) -> str:
        """The bounded `channel` label of the delivery metrics."""
        if entry.kind == KIND_DEFERRED:
            return "deferred"
        return entry.channel if self.registry.has(entry.channel) else "unknown"

    async def _deliver(self, entry: OutboxEntry) -> None:
        """Route by kind; raises DeliveryError unless the receiver confirmed."""
        if entry.kind == KIND_EFFECT:
            await self.registry.deliver(Effect(entry.channel, entry.payload,
                                               entry.idempotency_key, entry.transaction_id))
        elif entry.kind == KIND_DEFERRED and self.deferred is not None:
            await self.deferred(entry)
        else:
            raise DeliveryError(f"this replica cannot deliver {entry.kind} entries")

    async def _attempt(self, key: bytes, rev: int, entry: OutboxEntry,
                       fenced: LeaderLease | None) -> tuple[bool, str | None]:
        """Deliver a claimed entry (mod_revision `rev`) and record the outcome.
        Returns (delivered, error-for-the-caller)."""
        started = time.monotonic()
        label = self._label(entry)
        METRICS.delivery_attempts.labels(label).inc()
        permanent = False
        try:
            await asyncio.wait_for(self._deliver(entry), self.delivery_timeout_s)
        except DeliveryError as exc:
            reason, permanent = str(exc), exc.permanent
        except TimeoutError:
            reason = f"delivery timed out after {self.delivery_timeout_s:g}s"
        except Exception as exc:  # a channel bug must not break the caller
            log.exception("channel raised unexpectedly", extra={"channel": entry.target})
            reason = f"internal error: {type(exc).__name__}"
        else:
            log.info("effect delivered", extra={
                "kind": entry.kind, "channel": entry.target,
                "idempotency_key": entry.idempotency_key, "tx": entry.transaction_id,
                "attempts": entry.attempts + 1,
                "ms": int((time.monotonic() - started) * 1000), "replica": self.replica_id})
            METRICS.deliveries.labels(label, "delivered").inc()
            if self.after_delivery is not None:
                await self.after_delivery(key, entry)
            removed = await self._remove_delivered(key, rev)
            if not removed:
                self.confirmed[key] = rev
            return True, (None if removed else
                          "delivered; its outbox entry is retired once etcd answers (this "
                          "replica never sends it again)")
        if permanent:
            METRICS.deliveries.labels(label, "refused").inc()
            return False, await self._bury(key, rev, entry, reason, fenced)
        METRICS.deliveries.labels(label, "failed").inc()
        return False, await self._reschedule(key, rev, entry, reason, fenced)

    async def _remove_delivered(self, key: bytes, rev: int) -> bool:
        for attempt in range(_DELETE_ATTEMPTS):
            try:
                res = await self.store.txn([cmp_mod(key, rev)], [op_delete(key)],
                                           what="outbox delete")
            except StoreUnavailable as exc:
                log.warning("outbox delete failed", extra={
                    "key": key.decode(errors="replace"), "attempt": attempt + 1,
                    "error": str(exc)})
                await asyncio.sleep(0.1 * 2**attempt)
                continue
            except StoreError as exc:
                log.warning("outbox delete failed",
                            extra={"key": key.decode(errors="replace"), "error": str(exc)})
                return False
            if res.succeeded:
                return True
            # Not ours any more. If it is already gone, someone removed it: fine.
            try:
                return await self.store.get(key, what="outbox read") is None
            except StoreError:
                return False
        return False

    def _backoff(self, attempts: int) -> float:
        """Exponential backoff with full jitter (AWS architecture blog, 2015)."""
        cap = min(self.max_backoff_s, self.base_backoff_s * 2 ** max(0, attempts - 1))
        return random.uniform(0, cap)

    async def _reschedule(self, key: bytes, rev: int, entry: OutboxEntry, reason: str,
                          fenced: LeaderLease | None) -> str:
        now = time.time()
        updated = entry.failed(reason, now + self._backoff(entry.attempts + 1))
        log.warning("effect delivery failed", extra={
            "kind": entry.kind, "channel": entry.target,
            "idempotency_key": entry.idempotency_key, "tx": entry.transaction_id,
            "attempts": updated.attempts,
            "retry_in_s": round(updated.next_attempt_at - now, 3),
            "replica": self.replica_id, "error": reason})
        compare, put = [cmp_mod(key, rev)], [op_put(key, encode_entry(updated))]
        try:
            if fenced is not None:
                res = await fenced.fenced_txn(compare, put, what="outbox reschedule")
            else:
                res = await self.store.txn(compare, put, what="outbox reschedule")
        except NotLeader:
            return f"{reason} (not rescheduled: dispatcher lease lost; retried after the claim)"
        except StoreError as exc:
            log.warning("outbox reschedule failed",
                        extra={"key": key.decode(errors="replace"), "error": str(exc)})
            return f"{reason} (not rescheduled: {exc}; retried after the claim)"
        if not res.succeeded:
            return f"{reason} (entry changed concurrently)"
        return reason

    async def _bury(self, key: bytes, rev: int, entry: OutboxEntry, reason: str,
                    fenced: LeaderLease | None) -> str:
        """Move a permanently refused entry to the dead letters in ONE etcd transaction,
        guarded like every outbox write (the claim's mod_revision, plus the leader fence
        in the background): delete the entry, write the letter (refusing to overwrite
        another letter of the same key), and keep the key's reservation without a lease,
        so it stays taken for as long as the letter exists."""
        now = time.time()
        failed = entry.failed(reason, now)
        letter = DeadLetter(failed, now)
        dkey = self.keys.dead_letter(entry.owner, entry.idempotency_key)
        rkey = self.keys.effect_key(entry.owner, entry.idempotency_key)
        compare = [cmp_mod(key, rev), cmp_absent(dkey)]
        success: list[Op] = [op_delete(key), op_put(dkey, encode_dead_letter(letter)),
                             op_put(rkey, reservation_value(entry.transaction_id, 0, "dead"))]
        failure = [op_get(dkey)]
        try:
            if fenced is not None:
                res = await fenced.fenced_txn(compare, success, failure,
                                              what="outbox dead letter")
            else:
                res = await self.store.txn(compare, success, failure, what="outbox dead letter")
        except NotLeader:
            return (f"{reason} (refused permanently, but not yet moved to the dead letters: "
                    "dispatcher lease lost; tried again after the claim)")
        except StoreError as exc:
            log.warning("outbox dead letter write failed",
                        extra={"key": key.decode(errors="replace"), "error": str(exc)})
            return (f"{reason} (refused permanently, but not yet moved to the dead letters: "
                    f"{exc}; tried again after the claim)")
        if res.succeeded:
            log.error("effect refused permanently: moved to the dead letters", extra={
                "kind": entry.kind, "channel": entry.target,
                "idempotency_key": entry.idempotency_key, "tx": entry.transaction_id,
                "principal": entry.owner, "attempts": failed.attempts,
                "replica": self.replica_id, "error": reason})
            return f"{reason} (refused permanently: moved to the dead letters)"
        if res.first(0) is not None:
            # The key is a dead letter already (its reservation lapsed while that letter
            # waited, and the key was used again): never overwrite it; keep this entry in
            # the outbox, visible, until someone resolves the older letter.
            log.error("effect refused permanently, but its idempotency key is already a "
                      "dead letter; left in the outbox", extra={
                          "channel": entry.target, "idempotency_key": entry.idempotency_key,
                          "tx": entry.transaction_id, "principal": entry.owner})
            return await self._reschedule(
                key, rev, entry, f"{reason}; not moved to the dead letters: another dead "
                "letter holds this idempotency key (retry or discard it first)", fenced)
        return f"{reason} (entry changed concurrently)"

    async def pending(self) -> list[Pending]:
        return await pending(self.store, self.prefix)
