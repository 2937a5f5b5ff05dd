"""Approvals: a person signs off what cannot be undone, bound to exactly what they saw
(docs/approvals.md).

Why here, in the engine: the engine is the one place that knows exactly what a commit
will do (the write set, the staged effects, the gated calls), so it can stop a commit
at the gate, name what is to be approved by a digest, and later commit exactly that, or
undo it all.

The shape of it:

* At begin, the transaction's effective approval (`ApprovalSettings`, resolved from the
  default policy and the matching AgentTxPolicy) is stored in its header.
* A step records, in its own CAS, what it will do that needs approval
  (`tx/<id>/gate/<n>/<i>`): each effect it staged on a listed `channel` (or staged while
  its tool matches a `tool` glob), else, when its tool matches a glob, its call with the
  resolved arguments. Undoing the step deletes them with its other records.
* CommitTransaction with gated live steps does not commit (`Committer._gate`): ONE CAS
  makes the header AWAITING_APPROVAL with the digest and the expiry, lists the pending
  approval at `<prefix>/approvals/<id>` (so ListApprovals never scans transactions) and
  puts the notify event in the outbox.
* DecideApproval (`ApprovalDesk.decide`): approve = the commit's own etcd transaction
  (every read and written key compared with the revision the transaction observed, the
  header with the revision that holds the digest), so of two decisions exactly one
  applies; reject = the abort's compensation, ended as REJECTED. Expiry is the reaper's
  rejection.

The digest (`approval_digest`) is the hex SHA-256 of the canonical JSON (keys sorted, no
spaces, UTF-8) of

    {"gated":  [{"step_id": n, "tool": t, "channel": c, "arguments": a}, ...],
     "writes": [{"key": "kv:<key>" | "rec:<table>:<id>", "write": <document> | null}, ...]}

with the gated steps in step order and the writes in key order (`null`: a delete). A
transaction cannot change while it awaits approval (steps are refused), so the digest
computed at the gate is the one a decision compares.

What it must never do: commit anything whose digest was not named by the approver, let
the transaction's own principal decide (with authentication on), or write outside the
one CAS that each decision is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..contracts.layout import Keys, data_id
from ..contracts.outbox import OutboxEntry, effect_entry
from ..errors import FailedPrecondition, NotFound, PermissionDenied, StoreError
from ..observability.context import note
from ..observability.metrics import METRICS
from ..store.ops import Compare, KeyValueStore
from . import history as hist
from .cache import TxCache, TxState
from .history import COMMITTED, REJECTED, Ending
from .model import ApprovalPage, ApprovalView, Caller, DecisionOutcome, GatedStepView
from .ops import is_data_key
from .snapshot import Loader, not_found
from .state import (
    AWAITING_APPROVAL,
    GatedCall,
    Touched,
    TxHeader,
    from_json,
    to_json,
)
from .undo import Stale, Target, Undoer

log = logging.getLogger(__name__)

NOTIFY_EVENT = "approval.requested"
# The notify event goes to the outbox key `outbox/<tx>/000000`: a commit's own effects
# take the sequence numbers from 1, so the two never collide.
NOTIFY_SEQ = 0
EXPIRED_REASON = "approval timed out"
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
# Pending approvals read per etcd range: each carries its gated arguments and payloads.
LIST_READ_PAGE = 16


# ---- what is gated, and its digest (pure) ----------------------------------------------

@dataclass(frozen=True, slots=True)
class Gated:
    """One gated step: a call whose tool matched a glob (channel ""), or an effect on a
    gated channel (tool `effect.stage`, `arguments` = the effect's payload)."""

    step_id: int
    tool: str
    channel: str
    arguments: Any


def gated_steps(calls: Sequence[GatedCall]) -> list[Gated]:
    """What the live steps recorded as needing approval, in step order (a step's own in
    the order it staged them)."""
    return [Gated(c.step_id, c.tool, c.channel, c.arguments) for c in calls]


def write_set(keys: Keys, entries: Mapping[bytes, Touched]) -> list[tuple[str, Any]]:
    """The buffered writes commit would apply, as (data id, document or None for a
    delete), in key order."""
    out = []
    for dk, entry in entries.items():
        w = entry.state.write
        if not is_data_key(dk) or w is None:
            continue
        out.append((data_id(keys, dk), None if w.deleted else w.doc))
    return sorted(out, key=lambda kv: kv[0])


def canonical(doc: Any) -> bytes:
    """Canonical JSON: keys sorted, no spaces, UTF-8 (strings as they are, not escaped)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8", "surrogatepass")


def approval_digest(gated: Sequence[Gated], writes: Sequence[tuple[str, Any]]) -> str:
    """What an approver names to approve (module docstring): hex SHA-256."""
    doc = {"gated": [{"step_id": g.step_id, "tool": g.tool, "channel": g.channel,
                      "arguments": g.arguments} for g in gated],
           "writes": [{"key": key, "write": write} for key, write in writes]}
    return hashlib.sha256(canonical(doc)).hexdigest()


# ---- the pending approval's record (pure) ------------------------------------------------

@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """`<prefix>/approvals/<id>`: a pending approval, as ListApprovals shows it, with
    who may decide it (the principal's namespace and the policy's approvers)."""

    transaction_id: str
    principal: str
    namespace: str | None
    agent_id: str
    digest: str
    gated: tuple[Gated, ...]
    write_keys: tuple[str, ...]
    requested_at: float
    expires_at: float
    approvers: tuple[str, ...] = ()


def encode_record(r: ApprovalRecord) -> bytes:
    return to_json({
        "transaction_id": r.transaction_id, "principal": r.principal,
        "namespace": r.namespace, "agent_id": r.agent_id, "digest": r.digest,
        "gated": [[g.step_id, g.tool, g.channel, g.arguments] for g in r.gated],
        "write_keys": list(r.write_keys), "requested_at": r.requested_at,
        "expires_at": r.expires_at, "approvers": list(r.approvers)})


def decode_record(raw: bytes) -> ApprovalRecord:
    d = from_json(raw)
    return ApprovalRecord(
        d["transaction_id"], d["principal"], d.get("namespace"), d["agent_id"], d["digest"],
        tuple(Gated(int(g[0]), g[1], g[2], g[3]) for g in d["gated"]),
        tuple(d["write_keys"]), float(d["requested_at"]), float(d["expires_at"]),
        tuple(d.get("approvers", ())))


def notify_event(r: ApprovalRecord) -> dict[str, Any]:
    """What the notify channel receives (docs/approvals.md, "Notifications")."""
    return {"event": NOTIFY_EVENT, "transaction_id": r.transaction_id,
            "principal": r.principal, "agent_id": r.agent_id, "digest": r.digest,
            "gated": [{"step_id": g.step_id, "tool": g.tool, "channel": g.channel}
                      for g in r.gated],
            "expires_at": r.expires_at}


def notify_entry(keys: Keys, header: TxHeader, record: ApprovalRecord, channel: str, *,
                 now: float, claimed_by: str, claim_s: float) -> tuple[bytes, OutboxEntry]:
    """The notify event as an outbox entry (owned by the transaction's principal, whose
    key space its idempotency key `approval-requested-<id>` lives in)."""
    return (keys.outbox(header.id, NOTIFY_SEQ),
            effect_entry(channel, notify_event(record), f"approval-requested-{header.id}",
                         header.id, NOTIFY_SEQ, now=now, owner=header.principal,
                         claimed_by=claimed_by, claim_s=claim_s))


def view_of(r: ApprovalRecord) -> ApprovalView:
    return ApprovalView(
        r.transaction_id, r.principal, r.agent_id, r.digest,
        [GatedStepView(g.step_id, g.tool, g.channel,
                       json.dumps(g.arguments, ensure_ascii=False, separators=(",", ":")))
         for g in r.gated], list(r.write_keys), r.requested_at, r.expires_at)


# ---- who may decide (pure) ---------------------------------------------------------------

def in_scope(caller: Caller, namespace: str | None, approvers: Sequence[str],
             service_namespace: str) -> bool:
    """May `caller` see and decide an approval of a transaction begun in `namespace`
    (docs/approvals.md, "Who decides")? Without authentication everyone may (there are
    no identities); admins always may; an approver when it lives in the transaction's
    namespace or the service namespace and, when the policy names `approvers`, is one
    of them."""
    if not caller.authenticated or caller.admin:
        return True
    if not caller.approver or caller.namespace is None:
        return False
    if caller.namespace != namespace and caller.namespace != service_namespace:
        return False
    return not approvers or caller.principal in approvers


def require_approver(caller: Caller, rpc: str) -> None:
    """ListApprovals and DecideApproval are for approvers and admins."""
    if caller.authenticated and not (caller.approver or caller.admin):
        raise PermissionDenied(f"{rpc} needs the approver or admin role")


def four_eyes(caller: Caller, header: TxHeader) -> None:
    """The principal that began a transaction never decides its approval (with
    authentication on; without it there are no identities to tell apart)."""
    if caller.authenticated and caller.principal == header.principal:
        raise PermissionDenied(
            f"four eyes: {caller.principal} began transaction {header.id} and cannot "
            "decide its own approval; another approver must")


# ---- the desk: list, decide, expire --------------------------------------------------------

class Committing(Protocol):
    """What the desk needs of the committer (engine.commit.Committer)."""

    async def approve(self, state: TxState, caller: Caller) -> DecisionOutcome: ...


class ApprovalDesk:
    def __init__(self, *, store: KeyValueStore, keys: Keys, loader: Loader, undoer: Undoer,
                 txs: TxCache, committer: Committing, service_namespace: str) -> None:
        self.store, self.keys, self.loader, self.undoer = store, keys, loader, undoer
        self.txs, self.committer = txs, committer
        self.service_namespace = service_namespace

    # ---- ListApprovals -----------------------------------------------------------------

    async def list(self, caller: Caller, *, page_size: int, page_token: str,
                   budget: int) -> ApprovalPage:
        """Pending approvals the caller may decide, in transaction id order, a page at a
        time: at most `page_size` (default 100, at most 1000) and at most `budget` bytes
        of arguments, payloads and keys (every answer fits)."""
        require_approver(caller, "ListApprovals")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        prefix = self.keys.approvals_prefix()
        start = self.keys.approval(page_token) + b"\x00" if page_token else None
        out: list[ApprovalView] = []
        used = 0
        last = ""
        more = False
        async for page in self.store.pages(prefix, start=start, page_size=LIST_READ_PAGE,
                                           what="list approvals"):
            for kv in page:
                record = decode_record(kv.value)
                if not in_scope(caller, record.namespace, record.approvers,
                                self.service_namespace):
                    last = record.transaction_id
                    continue
                cost = len(kv.value)
                if out and (len(out) >= size or used + cost > budget):
                    more = True
                    break
                out.append(view_of(record))
                used += cost
                last = record.transaction_id
            if more:
                break
        note(listed=len(out))
        return ApprovalPage(out, last if more else "")

    # ---- DecideApproval ----------------------------------------------------------------

    async def decide(self, caller: Caller, tx_id: str, digest: str, approve: bool,
                     reason: str) -> DecisionOutcome:
        require_approver(caller, "DecideApproval")
        note(tx=tx_id, decision="approve" if approve else "reject")
        async with self.txs.locked(tx_id):
            state = await self.loader.whole(tx_id, use_cache=False)
            h = state.header
            approvers = (h.approval.approvers or ()) if h.approval is not None else ()
            if not in_scope(caller, h.namespace, approvers, self.service_namespace):
                raise not_found(tx_id)  # undecidable for this caller: as if unknown
            four_eyes(caller, h)
            state = await self.undoer.settle(state)
            if not state.complete:
                state = await self.loader.whole(tx_id, use_cache=False)
            h = state.header
            if h.status != AWAITING_APPROVAL or h.pending is None:
                raise FailedPrecondition(f"transaction {tx_id} is {h.status}, not awaiting "
                                         "approval")
            try:
                if approve:
                    if not hmac.compare_digest(digest.encode(), h.pending.digest.encode()):
                        raise FailedPrecondition(
                            f"the digest does not match what transaction {tx_id} awaits "
                            "approval for (a person approves exactly what they saw): list "
                            "the approvals again; nothing was changed")
                    outcome = await self.committer.approve(state, caller)
                else:
                    outcome = await self._reject(state, Ending(REJECTED, caller.principal,
                                                               reason))
            except Stale:
                raise await self._lost_race(tx_id) from None
        note(outcome=outcome.status)
        return outcome

    async def _lost_race(self, tx_id: str) -> Exception:
        """Another decision (or a withdrawal, or the reaper) changed the transaction
        first: say how it stands now, never decide again blindly."""
        self.txs.evict(tx_id)
        recorded = await hist.read(self.store, self.keys, tx_id)
        if recorded.header is None:
            how = (f" ({recorded.end.status} by {recorded.end.ended_by or 'an anonymous caller'})"
                   if recorded.end is not None else "")
            return NotFound(f"transaction {tx_id} not found: it was decided or ended "
                            f"concurrently{how}")
        now = ("being undone (rejected, expired or withdrawn)"
               if recorded.header.undoing is not None else recorded.header.status)
        return FailedPrecondition(f"transaction {tx_id} was decided or changed concurrently "
                                  f"(it is now {now}); nothing was done")

    async def _reject(self, state: TxState, ending: Ending, *,
                      fence: Callable[[], Sequence[Compare]] = lambda: (),
                      ) -> DecisionOutcome:
        """Compensate every live step and end the transaction as `ending` says (REJECTED).
        Raises Stale when the transaction changed first."""
        live = list(reversed(state.header.live))
        records = await self.loader.records(state, live)
        result = await self.undoer.run(state, records, Target(0, True, False, ending=ending),
                                       fence=fence)
        if result.errors:
            log.error("rejected transaction could not be compensated", extra={
                "tx": state.header.id, "errors": result.errors})
            raise FailedPrecondition(
                f"transaction {state.header.id} was rejected but its compensation failed "
                f"({'; '.join(result.errors)}); it awaits a manual rollback "
                "(RollbackTransaction)")
        METRICS.transactions_ended.labels("rejected").inc()
        METRICS.approval_decisions.labels(
            "expired" if ending.ended_by == "reaper" else "rejected").inc()
        return DecisionOutcome(REJECTED)

    # ---- expiry (the reaper) -----------------------------------------------------------

    async def expire(self, tx_id: str, header_rev: int,
                     fence: Callable[[], Sequence[Compare]]) -> bool:
        """Reject a transaction whose approval timed out (the reaper's leader, fenced).
        False when it changed meanwhile, or could not be compensated (then it waits for
        a manual rollback, which the reaper's own alert shows)."""
        async with self.txs.locked(tx_id):
            try:
                state = await self.loader.for_step(tx_id, (), (), use_cache=False)
            except NotFound:
                return False
            h = state.header
            if state.rev != header_rev or h.status != AWAITING_APPROVAL or h.pending is None:
                return False
            try:
                await self._reject(state, Ending(REJECTED, "reaper", EXPIRED_REASON),
                                   fence=fence)
            except (Stale, FailedPrecondition, StoreError) as exc:
                log.warning("expired approval not rejected", extra={"tx": tx_id,
                                                                   "error": str(exc)})
                return False
            log.info("approval timed out: rejected", extra={"tx": tx_id,
                                                            "digest": h.pending.digest})
            return True


def record_for(keys: Keys, state: TxState, gated: Sequence[Gated], digest: str,
               now: float) -> ApprovalRecord:
    h = state.header
    assert h.approval is not None
    return ApprovalRecord(
        h.id, h.principal, h.namespace, h.agent_id, digest, tuple(gated),
        tuple(key for key, _ in write_set(keys, state.entries)), now,
        now + (h.approval.timeout_s or 0), h.approval.approvers or ())


__all__ = ["COMMITTED", "EXPIRED_REASON", "ApprovalDesk", "ApprovalRecord", "Gated",
           "approval_digest", "canonical", "decode_record",
           "encode_record", "four_eyes", "gated_steps", "in_scope", "notify_entry",
           "notify_event", "record_for", "require_approver", "view_of", "write_set"]
