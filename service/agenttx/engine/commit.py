"""CommitTransaction: one compare-and-swap over the read and write sets (SPEC §2).

`ops.commit_plan` builds the etcd transaction as data from a `CommitSnapshot`; this
module loads the snapshot (from the replica's cache when it holds the whole
transaction, so a commit is one round trip), sends the plan and decides what its
outcome means. A lost compare on a data key is a conflict: another transaction
committed a key this one read or wrote since it first touched it. The transaction is
then compensated (fs writes and sagas undone, effects discarded) and ended, and the
call answers ABORTED. A CAS that times out is never retried: the header is re-read to
decide (gone = applied).

Staged effects enter the outbox in the commit's own etcd transaction, as typed
`OutboxEntry` records (contracts.outbox) claimed by this replica, and are delivered
during the call from those very records (never re-read or decoded): the engine hands
them to whatever `OutboxDispatcher` it was given, without importing the effects
package. Their idempotency keys stay reserved for the retention window on a shared lease
(`RetentionLease`).

A transaction whose policy requires approvals may stop at the gate instead (`_gate`,
docs/approvals.md): its commit then writes nothing but the AWAITING_APPROVAL header, the
pending approval and the notify event; the approver's DecideApproval later runs the very
same commit (`approve`) with the revisions the transaction observed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from .. import failpoints
from ..contracts.layout import Keys, describe_data_key
from ..contracts.outbox import (
    DEFERRED_CHANNEL,
    OutboxEntry,
    deferred_entry,
    effect_entry,
    encode_entry,
)
from ..errors import Conflict, FailedPrecondition, StoreUnavailable
from ..observability.context import note
from ..observability.metrics import METRICS
from ..store.ops import KeyValue, KeyValueStore
from . import approvals
from . import history as hist
from .cache import DataCache, TxCache, TxState
from .current import on_current_state
from .history import ABORTED, COMMITTED, Ending
from .model import Caller, CommitOutcome, DecisionOutcome
from .ops import CommitSnapshot, commit_plan, gate_plan, is_data_key
from .snapshot import Loader, not_found
from .state import AWAITING_APPROVAL, PendingApproval, StagedEffect, TxHeader, to_json
from .steps import require_active, require_owner
from .undo import Stale, Target, Undoer

log = logging.getLogger(__name__)

# Keys compared per diagnostic read after a conflict (well inside etcd's op limit).
DIAGNOSE_BATCH = 100


class RetentionLease:
    """One etcd lease shared by the idempotency keys committed in a time bucket, so a
    commit never grants a lease of its own: keys live between `retention_s` and
    `retention_s + bucket` after their commit, then etcd deletes them. `keep_fresh`
    (a background task) grants the next lease before commits need it."""

    def __init__(self, store: KeyValueStore, retention_s: int) -> None:
        self.store = store
        self.retention_s = retention_s
        self.bucket_s = max(1, min(3600, retention_s // 4))
        self._lease = 0
        self._granted_at = 0.0

    def _fresh(self) -> bool:
        return bool(self._lease) and time.monotonic() - self._granted_at <= self.bucket_s

    async def lease_id(self) -> int:
        if not self._fresh():
            await self.renew()
        return self._lease

    async def renew(self) -> None:
        lease, _ = await self.store.grant_lease(self.retention_s + self.bucket_s,
                                                what="lease retention")
        self._lease, self._granted_at = lease, time.monotonic()

    async def keep_fresh(self) -> None:
        """Renew a little before each bucket ends; etcd outages are retried."""
        while True:
            try:
                if not self._lease or time.monotonic() - self._granted_at > self.bucket_s * 0.8:
                    await self.renew()
            except Exception as exc:  # a commit will grant one itself if it must
                log.warning("retention lease renewal failed", extra={"error": str(exc)})
            await asyncio.sleep(max(0.5, self.bucket_s * 0.1))


class OutboxDispatcher(Protocol):
    """What the commit needs of the effects dispatcher (effects.outbox.Dispatcher): who
    claims the entries it writes, for how long, and the delivery right after commit."""

    replica_id: str
    claim_s: float

    async def deliver_committed(self, entries: Sequence[tuple[bytes, int, OutboxEntry]]
                                ) -> tuple[int, list[str]]: ...


def outbox_entries(keys: Keys, header: TxHeader, effects: Sequence[StagedEffect], *,
                   now: float, claimed_by: str = "", claim_s: float = 0.0
                   ) -> list[tuple[bytes, OutboxEntry]]:
    """The outbox entries a commit writes, one per staged effect in step order (seq from
    1), owned by the transaction's principal. Claimed by `claimed_by` (the committing
    replica) until `now + claim_s`, so the background dispatcher leaves them to its
    commit-time delivery meanwhile."""
    out: list[tuple[bytes, OutboxEntry]] = []
    for seq, e in enumerate(effects, 1):
        if e.channel.startswith(DEFERRED_CHANNEL):  # a toolset call (docs/toolsets.md)
            doc = e.payload if isinstance(e.payload, dict) else {}
            entry = deferred_entry(e.channel[len(DEFERRED_CHANNEL):], str(doc.get("name")),
                                   doc.get("arguments"), e.idempotency_key, header.id, seq,
                                   now=now, owner=header.principal, claimed_by=claimed_by,
                                   claim_s=claim_s)
        else:
            entry = effect_entry(e.channel, e.payload, e.idempotency_key, header.id, seq,
                                 now=now, owner=header.principal, claimed_by=claimed_by,
                                 claim_s=claim_s)
        out.append((keys.outbox(header.id, seq), entry))
    return out


@dataclass(frozen=True)
class Conflicted:
    """A commit that lost to another transaction's write: compensated (unless `errors`
    says which undo failed) and ended as ABORTED."""

    why: str
    errors: list[str]


class Committer:
    def __init__(self, *, store: KeyValueStore, keys: Keys, loader: Loader, undoer: Undoer,
                 txs: TxCache, data: DataCache, dispatcher: OutboxDispatcher | None,
                 retention: RetentionLease) -> None:
        self.store, self.keys, self.loader, self.undoer = store, keys, loader, undoer
        self.txs, self.data, self.dispatcher, self.retention = txs, data, dispatcher, retention

    async def commit(self, caller: Caller, tx_id: str) -> CommitOutcome:
        note(tx=tx_id)

        async def load() -> TxState:
            return await self.loader.whole(tx_id, use_cache=False)

        async def judge(state: TxState) -> TxState:
            require_owner(state, caller)
            state = await self.undoer.settle(state)
            if not state.complete:
                state = await self.loader.whole(tx_id, use_cache=False)
            require_active(state.header)
            return state

        def on_stale(stale: Stale, from_cache: bool) -> bool:
            if not from_cache:
                raise FailedPrecondition(f"transaction {tx_id} was changed concurrently; "
                                         "retry commit") from None
            return False  # judged on a cached state that may be stale: ask etcd

        def gave_up() -> Exception:
            return FailedPrecondition(f"transaction {tx_id} kept changing concurrently; "
                                      "retry commit")

        async def act(state: TxState) -> CommitOutcome:
            return await self._commit(state, caller)

        async with self.txs.locked(tx_id):
            return await on_current_state(self.txs, tx_id, load=load, judge=judge,
                                          act=act, on_stale=on_stale,
                                          gave_up=gave_up, attempts=4,
                                          usable=lambda cached: cached.complete)

    async def _commit(self, state: TxState, caller: Caller) -> CommitOutcome:
        h = state.header
        if h.approval is not None:
            stopped = await self._gate(state)
            if stopped is not None:
                return stopped
        outcome = await self._apply(state, caller.principal)
        if isinstance(outcome, Conflicted):
            if outcome.errors:
                raise Conflict(f"commit aborted: {outcome.why}; compensation failed "
                               f"({'; '.join(outcome.errors)}): call RollbackTransaction to "
                               "finish undoing")
            raise Conflict(
                f"commit aborted: {outcome.why} (another transaction committed it after "
                f"transaction {h.id} first read or wrote it); the transaction was "
                "compensated and ended")
        return outcome

    async def approve(self, state: TxState, caller: Caller) -> DecisionOutcome:
        """DecideApproval's approval (engine.approvals): the commit runs now, on the state
        that awaited approval, comparing the header with the revision that holds the
        digest and every key with the revision the transaction observed. A conflict is
        a decision's outcome (ABORTED, compensated), not an error. Raises Stale when
        another decision changed the transaction first."""
        failpoints.hit("approval.before_txn")
        outcome = await self._apply(state, caller.principal, deciding=True)
        if isinstance(outcome, Conflicted):
            METRICS.approval_decisions.labels("conflict").inc()
            if outcome.errors:
                raise FailedPrecondition(
                    f"approved, but the commit of transaction {state.header.id} was aborted "
                    f"({outcome.why}) and its compensation failed "
                    f"({'; '.join(outcome.errors)}); it awaits a manual rollback")
            return DecisionOutcome(hist.ABORTED)
        METRICS.approval_decisions.labels("approved").inc()
        return DecisionOutcome(COMMITTED, outcome.steps_committed, outcome.effects_dispatched,
                               outcome.dispatch_errors)

    async def _gate(self, state: TxState) -> CommitOutcome | None:
        """Stop at the approval gate when live steps need approval (docs/approvals.md):
        ONE CAS makes the transaction AWAITING_APPROVAL with its digest and expiry, lists
        the pending approval and puts the notify event in the outbox. None: nothing is
        gated, commit as usual."""
        h = state.header
        assert h.approval is not None
        calls = await self.loader.gated(h.id)
        gated = approvals.gated_steps(calls)
        if not gated:
            return None
        writes = approvals.write_set(self.keys, state.entries)
        digest = approvals.approval_digest(gated, writes)
        now = time.time()
        record = approvals.record_for(self.keys, state, gated, digest, now)
        awaiting = replace(h, status=AWAITING_APPROVAL, updated_at=now, fs_pending=None,
                           pending=PendingApproval(digest, now, record.expires_at))
        d = self.dispatcher
        notify = [approvals.notify_entry(self.keys, h, record, h.approval.notify_channel,
                                         now=now, claimed_by=d.replica_id if d else "",
                                         claim_s=d.claim_s if d else 0.0)
                  ] if h.approval.notify_channel else []
        plan = gate_plan(self.keys, h, state.rev, awaiting, approvals.encode_record(record),
                         [(key, encode_entry(entry)) for key, entry in notify])
        self.txs.evict(h.id)
        try:
            res = await self.store.txn(plan.compares, plan.success, plan.failure,
                                       what="commit")
        except StoreUnavailable:
            kv = await self.store.get(self.keys.tx_header(h.id), what="commit read")
            if kv is None:
                raise not_found(h.id) from None
            if kv.mod_revision == state.rev:
                raise StoreUnavailable(f"etcd timed out; transaction {h.id} was not "
                                       "committed; retry commit") from None
            raise FailedPrecondition(f"transaction {h.id} was changed concurrently; call "
                                     "GetTransaction (it may await approval)") from None
        if not res.succeeded:
            current = res.first(0)
            if current is None:
                raise not_found(h.id)
            METRICS.cas_conflicts.labels("commit").inc()
            raise Stale(None)
        note(awaiting_approval=True, gated=len(gated), digest=digest)
        log.info("commit awaits approval", extra={
            "tx": h.id, "digest": digest, "gated": [g.step_id for g in gated],
            "expires_at": record.expires_at})
        if notify and d is not None:
            delivered, errors = await self._dispatch(
                [(key, res.revision, entry) for key, entry in notify])
            if errors:
                log.warning("approval notification not delivered yet; retried in the "
                            "background", extra={"tx": h.id, "errors": errors})
        return CommitOutcome(False, 0, 0, [], awaiting_approval=True, approval_digest=digest)

    async def _apply(self, state: TxState, ended_by: str, *, deciding: bool = False
                     ) -> CommitOutcome | Conflicted:
        """The commit's one etcd transaction (SPEC §2), ended by `ended_by`; a lost
        compare on a data key is compensated and reported as `Conflicted`. Raises Stale
        when the header moved (nothing written)."""
        h = state.header
        effects = [e for step in sorted(state.effects) for e in state.effects[step]]
        d = self.dispatcher
        outbox = outbox_entries(self.keys, h, effects, now=time.time(),
                                claimed_by=d.replica_id if d is not None else "",
                                claim_s=d.claim_s if d is not None else 0.0)
        lease = await self.retention.lease_id() if effects else 0
        snap = CommitSnapshot(h, state.rev, dict(state.entries), effects,
                              [(key, encode_entry(entry)) for key, entry in outbox])
        steps = h.next_step_id - 1
        ended = await self.undoer.history.end(h, Ending(COMMITTED, ended_by),
                                              steps_committed=steps, effects=len(effects))
        plan = commit_plan(self.keys, snap, reservation_lease=lease, history=[ended])
        try:
            res = await self.store.txn(plan.compares, plan.success, plan.failure, what="commit")
        except StoreUnavailable:
            self.txs.evict(h.id)
            return await self._fate(state, steps, bool(effects), ended_by, deciding)
        if res.succeeded:
            failpoints.hit("approval.after_txn" if deciding else "commit.after_txn")
            self.txs.evict(h.id)
            self._remember_writes(state, res.revision)
            METRICS.transactions_ended.labels("committed").inc()
            note(steps=steps, effects=len(effects))
            dispatched, errors = await self._dispatch(
                [(key, res.revision, entry) for key, entry in outbox])
            return CommitOutcome(True, steps, dispatched, errors)
        current = res.first(0)
        if current is None:
            self.txs.evict(h.id)
            if deciding:
                raise Stale(None)
            raise not_found(h.id)
        if current.mod_revision != state.rev:
            self.txs.evict(h.id)
            METRICS.cas_conflicts.labels("commit").inc()
            raise Stale(None)  # commit() reloads once, or answers FAILED_PRECONDITION
        METRICS.cas_conflicts.labels("commit").inc()
        conflicts = await self._conflicts(state)
        why = f"conflict on {', '.join(conflicts) or 'a key it read'}"
        errors = await self._compensate_and_end(state, why, ended_by)
        METRICS.transactions_ended.labels("conflict").inc()
        return Conflicted(why, errors)

    def _remember_writes(self, state: TxState, revision: int) -> None:
        for dk, entry in state.entries.items():
            w = entry.state.write
            if not is_data_key(dk) or w is None:
                continue
            if w.deleted:
                self.data.remember(dk, None)
            else:
                self.data.remember(dk, KeyValue(dk, w.raw or to_json(w.doc), revision,
                                                revision, 0))

    async def _conflicts(self, state: TxState) -> list[str]:
        """Name the keys whose revision moved since the transaction observed them."""
        observed = [(dk, e.observed) for dk, e in state.entries.items()
                    if is_data_key(dk) and e.observed is not None]
        out: list[str] = []
        for i in range(0, len(observed), DIAGNOSE_BATCH):
            batch = observed[i:i + DIAGNOSE_BATCH]
            got = await self.store.get_many([dk for dk, _ in batch], what="commit diagnose")
            for dk, seen in batch:
                kv = got.get(dk)
                self.data.remember(dk, kv)
                if (kv.mod_revision if kv else 0) != seen:
                    out.append(describe_data_key(self.keys, dk))
        return out[:5]

    async def _compensate_and_end(self, state: TxState, why: str, ended_by: str) -> list[str]:
        """Undo every live step of a commit that conflicted and end it (ABORTED); the
        undo errors, when one failed (it then awaits a manual rollback)."""
        live = list(reversed(state.header.live))
        records = await self.loader.records(state, live)
        ending = Ending(ABORTED, ended_by, f"commit aborted: {why}")
        try:
            result = await self.undoer.run(state, records, Target(0, True, False,
                                                                  ending=ending))
        except Stale:
            raise FailedPrecondition(f"transaction {state.header.id} was changed concurrently "
                                     "while its conflict was being compensated") from None
        if result.errors:
            log.error("compensation failed", extra={"tx": state.header.id, "why": why,
                                                    "errors": result.errors})
        return result.errors

    async def _fate(self, state: TxState, steps: int, had_effects: bool, ended_by: str,
                    deciding: bool) -> CommitOutcome:
        """The commit CAS timed out: read the header to decide, never retry blindly.
        For a decision, whose race with another decision is expected, the end record
        says whether this one applied."""
        h = state.header
        try:
            kv = await self.store.get(self.keys.tx_header(h.id), what="commit read")
        except StoreUnavailable:
            raise StoreUnavailable(
                f"etcd unreachable while committing transaction {h.id}; the commit's outcome "
                "is unknown: call GetTransaction (NOT_FOUND means it applied)") from None
        if kv is not None and kv.mod_revision == state.rev:
            raise StoreUnavailable(f"etcd timed out; transaction {h.id} was not committed; "
                                   "retry commit")
        if kv is None and deciding:
            recorded = await hist.read(self.store, self.keys, h.id)
            end = recorded.end
            if end is None or end.status != COMMITTED or end.ended_by != ended_by:
                raise Stale(None)  # another decision ended it: the desk says how
        if kv is None:
            # Gone: our commit applied (aborts and reaping also end it, but only after
            # reading this same header revision, which our CAS would then have lost to).
            METRICS.transactions_ended.labels("committed").inc()
            return CommitOutcome(True, steps, 0, ["effects will be dispatched in the background"]
                                 if had_effects else [])
        raise FailedPrecondition(f"transaction {h.id} was changed concurrently")

    async def _dispatch(self, entries: list[tuple[bytes, int, OutboxEntry]]
                        ) -> tuple[int, list[str]]:
        """Deliver what the commit just put in the outbox (key, the commit's revision, the
        entry as written): one etcd write per delivered effect retires its entry (a
        confirmed delivery is never repeated)."""
        if not entries or self.dispatcher is None:
            return 0, []
        try:
            return await self.dispatcher.deliver_committed(entries)
        except Exception as exc:  # delivery never fails a commit that applied
            log.exception("dispatch after commit failed")
            return 0, [f"dispatch deferred to background: {type(exc).__name__}"]
