"""The durable effects outbox and its dispatcher: at-least-once, never after a confirmed send.

Why this module exists: a committed effect must reach its receiver even if the replica
that committed it dies a moment later, and it must never be sent again once its
delivery was confirmed (SPEC §6). So the commit writes each effect as an outbox entry in
the same etcd transaction as the data (`outbox_key` / `new_entry`), then:

* the committing replica delivers right away (`Dispatcher.deliver_committed`); the entry
  is created *claimed* by that replica for `claim_s` seconds so the background loop
  leaves it alone meanwhile;
* whatever is left (receiver down, replica died) is retried by `Dispatcher.run` on the
  one replica holding the dispatcher lease (`P/leader/dispatcher`), with exponential
  backoff and full jitter.

Entry lifecycle, every step a compare-and-swap on the entry's mod_revision:

    due & unclaimed --claim (fenced)--> claimed by me --deliver--> ok:   delete
                                                                   fail: reschedule
                                                                         (fenced)

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
no ordering guarantee between effects. An entry is retried until delivered (no attempt
cap: dropping a committed effect would break the contract); `pending()` shows them.

What it must never do: deliver an entry it could not claim, raise a delivery failure to
the commit path, or delete an entry whose delivery was not confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..contracts.layout import Keys
from ..errors import StoreError, StoreUnavailable
from ..observability.metrics import METRICS
from ..store.client import KeyValue, Store, cmp_mod, op_delete, op_put
from ..store.lease import LeaderLease, NotLeader
from .channels import ChannelRegistry, DeliveryError, Effect

log = logging.getLogger("agenttx.effects")

# last_error is for humans; keep entries small.
_MAX_ERROR_CHARS = 500
# A delete after a confirmed delivery is retried this many times on a transient etcd
# error (safe: it is guarded by the claim's mod_revision) to keep the redelivery window
# small.
_DELETE_ATTEMPTS = 3


# Key layout lives in contracts.layout; these are thin, prefix-taking conveniences.

def outbox_prefix(prefix: str) -> bytes:
    return Keys(prefix).outbox_prefix()


def outbox_key(prefix: str, tx_id: str, seq: int) -> bytes:
    return Keys(prefix).outbox(tx_id, seq)


def leader_key(prefix: str) -> bytes:
    return Keys(prefix).leader("dispatcher")


def new_entry(effect: Effect, seq: int, *, now: float, claimed_by: str | None,
              claim_s: float = 30.0) -> bytes:
    """The outbox value written by the commit txn. With `claimed_by` set, the entry is
    reserved for that replica's commit-time delivery until `now + claim_s`."""
    return _encode({
        "channel": effect.channel,
        "payload": effect.payload,
        "idempotency_key": effect.idempotency_key,
        "transaction_id": effect.transaction_id,
        "seq": seq,
        "attempts": 0,
        "next_attempt_at": now,
        "claimed_by": claimed_by,
        "claim_until": now + claim_s if claimed_by else 0.0,
        "last_error": None,
        "created_at": now,
    })


def _encode(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":"), sort_keys=True).encode()


def _decode(kv: KeyValue) -> dict[str, Any] | None:
    try:
        entry = json.loads(kv.value)
    except ValueError:
        entry = None
    if not isinstance(entry, dict) or not {"channel", "idempotency_key"} <= entry.keys():
        log.error("outbox entry unreadable, left in place",
                  extra={"key": kv.key.decode(errors="replace")})
        return None
    return entry


def _effect(entry: dict[str, Any]) -> Effect:
    return Effect(
        channel=str(entry["channel"]),
        payload=entry.get("payload"),
        idempotency_key=str(entry["idempotency_key"]),
        transaction_id=str(entry.get("transaction_id", "")),
    )


def _is_due(entry: dict[str, Any], now: float) -> bool:
    if float(entry.get("next_attempt_at") or 0.0) > now:
        return False
    return not entry.get("claimed_by") or float(entry.get("claim_until") or 0.0) <= now


async def pending(store: Store, prefix: str) -> list[dict[str, Any]]:
    """Every outbox entry (delivered entries are deleted, so: everything not yet
    confirmed), each with its `key` and `mod_revision`, in key order."""
    out = []
    for kv in await store.get_prefix(outbox_prefix(prefix)):
        entry = _decode(kv)
        if entry is not None:
            out.append({**entry, "key": kv.key.decode(), "mod_revision": kv.mod_revision})
    return out


class Dispatcher:
    """Delivers outbox entries: right after a commit, and in the background as leader."""

    def __init__(self, store: Store, prefix: str, registry: ChannelRegistry, replica_id: str,
                 *, lease_ttl_s: int = 10, poll_interval_s: float = 1.0,
                 base_backoff_s: float = 0.5, max_backoff_s: float = 60.0,
                 claim_s: float = 30.0, delivery_timeout_s: float | None = None,
                 recovery_grace_s: float | None = None) -> None:
        self.store = store
        self.prefix = Keys(prefix).prefix
        self.registry = registry
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
        self.after_delivery: Callable[[bytes, dict[str, Any]], Awaitable[None]] | None = None

    # ---- commit-time path --------------------------------------------------------------

    def entry_for(self, effect: Effect, seq: int) -> tuple[bytes, bytes]:
        """(key, value) of the outbox put a commit txn makes, claimed by this replica."""
        return (outbox_key(self.prefix, effect.transaction_id, seq),
                new_entry(effect, seq, now=time.time(), claimed_by=self.replica_id,
                          claim_s=self.claim_s))

    async def deliver_committed(self, entries: list[tuple[bytes, int]],
                                values: dict[bytes, bytes] | None = None
                                ) -> tuple[int, list[str]]:
        """Deliver entries a commit txn just wrote (key, mod_revision from its header).

        `values`, when the caller has them (the committing engine does), are the entries
        as written at that revision, which saves reading them back from etcd.
        Returns (delivered count, ["<channel> <idempotency_key>: <reason>", ...]).
        Never raises for a delivery or etcd failure: whatever is not delivered stays in
        the outbox for the background loop.
        """
        if not entries:
            return 0, []
        keys = [k for k, _ in entries]
        if values is not None and all(k in values for k in keys):
            got: dict[bytes, KeyValue | None] = {
                k: KeyValue(k, values[k], rev, rev, 0) for k, rev in entries}
            return await self._deliver_read(entries, got)
        try:
            got = await self.store.get_many(keys, what="outbox read")
        except StoreError as exc:
            log.warning("outbox read failed after commit", extra={"error": str(exc)})
            return 0, [f"{k.decode(errors='replace')}: {exc}; left for background retry"
                       for k in keys]
        return await self._deliver_read(entries, got)

    async def _deliver_read(self, entries: list[tuple[bytes, int]],
                            got: dict[bytes, KeyValue | None]) -> tuple[int, list[str]]:
        delivered, errors = 0, []
        for key, rev in sorted(entries):
            if key in self.confirmed:
                continue
            kv = got.get(key)
            if kv is None:
                continue  # already delivered and removed elsewhere
            entry = _decode(kv)
            if entry is None:
                errors.append(f"{key.decode(errors='replace')}: unreadable outbox entry")
                continue
            label = f"{entry['channel']} {entry['idempotency_key']}"
            if kv.mod_revision != rev:
                errors.append(f"{label}: outbox entry taken over; left to the dispatcher")
                continue
            ok, error = await self._attempt(key, rev, entry, fenced=None)
            delivered += ok
            if error:
                errors.append(f"{label}: {error}")
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
        """One pass over the outbox, a page at a time. True if anything was attempted."""
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
                    oldest = max(oldest, now - float(entry.get("created_at") or now))
                if entry is None or kv.key in self.confirmed or not _is_due(entry, now):
                    continue
                if recovering and entry.get("claimed_by") not in (None, self.replica_id):
                    continue  # its claimer may hold a confirmed delivery: let it retire first
                attempted |= await self._claim_and_attempt(kv, entry)
        METRICS.outbox_depth.set(depth)
        METRICS.outbox_oldest_age.set(oldest)
        return attempted

    async def _claim_and_attempt(self, kv: KeyValue, entry: dict[str, Any]) -> bool:
        claimed = {**entry, "claimed_by": self.replica_id,
                   "claim_until": time.time() + self.claim_s}
        res = await self.lease.fenced_txn(
            [cmp_mod(kv.key, kv.mod_revision)], [op_put(kv.key, _encode(claimed))],
            what="outbox claim",
        )
        if not res.succeeded:
            return False  # changed under us (delivered at commit time, or rescheduled)
        await self._attempt(kv.key, res.revision, claimed, fenced=self.lease)
        return True

    # ---- one delivery ------------------------------------------------------------------

    async def _attempt(self, key: bytes, rev: int, entry: dict[str, Any],
                       fenced: LeaderLease | None) -> tuple[bool, str | None]:
        """Deliver a claimed entry (mod_revision `rev`) and record the outcome.
        Returns (delivered, error-for-the-caller)."""
        effect = _effect(entry)
        started = time.monotonic()
        label = effect.channel if self.registry.has(effect.channel) else "unknown"
        METRICS.delivery_attempts.labels(label).inc()
        try:
            await asyncio.wait_for(self.registry.deliver(effect), self.delivery_timeout_s)
        except DeliveryError as exc:
            reason = str(exc)
        except TimeoutError:
            reason = f"delivery timed out after {self.delivery_timeout_s:g}s"
        except Exception as exc:  # a channel bug must not break the caller
            log.exception("channel raised unexpectedly", extra={"channel": effect.channel})
            reason = f"internal error: {type(exc).__name__}"
        else:
            log.info("effect delivered", extra={
                "channel": effect.channel, "idempotency_key": effect.idempotency_key,
                "tx": effect.transaction_id, "attempts": int(entry.get("attempts", 0)) + 1,
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

    async def _reschedule(self, key: bytes, rev: int, entry: dict[str, Any], reason: str,
                          fenced: LeaderLease | None) -> str:
        attempts = int(entry.get("attempts", 0)) + 1
        now = time.time()
        updated = {
            **entry,
            "attempts": attempts,
            "next_attempt_at": now + self._backoff(attempts),
            "last_error": reason[:_MAX_ERROR_CHARS],
            "claimed_by": None,
            "claim_until": 0.0,
        }
        log.warning("effect delivery failed", extra={
            "channel": entry["channel"], "idempotency_key": entry["idempotency_key"],
            "tx": entry.get("transaction_id"), "attempts": attempts,
            "retry_in_s": round(updated["next_attempt_at"] - now, 3),
            "replica": self.replica_id, "error": reason})
        compare, put = [cmp_mod(key, rev)], [op_put(key, _encode(updated))]
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

    async def pending(self) -> list[dict[str, Any]]:
        return await pending(self.store, self.prefix)
