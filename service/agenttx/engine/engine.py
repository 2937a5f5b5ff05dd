"""The Engine facade: begin, step, commit, rollback, get, list, expire.

All state lives in etcd (contracts.layout); replicas keep only caches that every write
validates, so any replica can serve any call. Every state change is ONE etcd
transaction guarded by compare-and-swap on the transaction header's mod_revision.

etcd round trips per RPC (docs/architecture.md; pinned by tests/integration/
test_round_trips.py), on the replica that served the transaction's previous call:
- BeginTransaction: 1 (header + quota slot, created iff absent).
- ExecuteStep, success: 1 CAS. On another replica: +1 read (header, referenced steps'
  records, the entries of the keys the tool names). +1 when a key the step assumed had
  changed (the CAS failed and is run again on what its failure branch returned).
- ExecuteStep, failure: 1 CAS for a local retry; a rollback that undoes files or sagas
  +1 intent write before touching the disk (crash safety), +1 read of undone records
  not cached.
- CommitTransaction: 1 CAS (+1 read on another replica), +1 write per effect delivered
  during the call (retiring its outbox entry).
- RollbackTransaction: 1-2 (+1 intent write when files are undone).
- GetTransaction: 1 (header, context log and the activity mark in one transaction).
- GetTransactionHistory: 1 (+1 per further page of entries).
- ListTransactions: 1 per page of headers.
- CommitTransaction under a policy that requires approvals: +1 read of the gated calls;
  stopping at the gate is that 1 CAS (+1 write when the notify event is delivered).
- DecideApproval: 1 read of the whole transaction, then what a commit (approve) or an
  abort (reject) costs.
- ListApprovals: 1 per page of pending approvals (never a read of every transaction).
History (engine.history) adds none: each step's entry and each end record are operations
inside the transactions above.

Nothing here imports grpc or aetcd: errors are agenttx.errors, results engine.model.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..contracts.layout import Keys
from ..errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from ..observability.context import note
from ..observability.metrics import METRICS
from ..store.ops import Compare, Get, KeyValueStore, Put, cmp_absent, cmp_exists, prefix_end
from ..tools.describe import ToolDescription, describe_all
from ..tools.registry import Scope, ToolRegistry
from . import history as hist
from .approvals import ApprovalDesk
from .cache import DataCache, TxCache, TxState
from .commit import Committer, RetentionLease
from .current import on_current_state
from .history import (
    ABORTED,
    EXPIRED,
    Ending,
    HistoryWriter,
    PinnedLeases,
    history_header_bytes,
)
from .limits import Limits
from .model import (
    ANONYMOUS,
    ApprovalPage,
    Caller,
    CommitOutcome,
    ContextItem,
    DecisionOutcome,
    RollbackOutcome,
    StepOutcome,
    TransactionHistory,
    TransactionPage,
    TransactionSummary,
    TransactionView,
)
from .policy import EffectivePolicy
from .snapshot import Loader, not_found
from .state import (
    ACTIVE,
    AWAITING_APPROVAL,
    TxHeader,
    TxPolicy,
    decode_context,
    decode_header,
    encode_header,
    to_json,
)
from .status import ServiceCounts, read_counts
from .steps import Stepper, require_owner
from .undo import Stale, Target, Undoer, write_interrupted

log = logging.getLogger(__name__)

ResolvePolicy = Callable[[str, Mapping[str, str], dict[str, Any], Caller], EffectivePolicy]

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
# Free-slot attempts at begin before counting the principal's open transactions.
SLOT_ATTEMPTS = 6


class Engine:
    def __init__(
        self,
        *,
        store: KeyValueStore,
        keys: Keys,
        tools: ToolRegistry,
        resolve_policy: ResolvePolicy,
        default_fs_root: str,
        replica_id: str,
        channel_names: Callable[[], list[str]],
        max_txn_ops: int = 1024,
        max_request_bytes: int = 16 * 1024 * 1024,
        dispatcher: Any = None,
        max_open_transactions: int = 1000,
        effect_key_retention_s: int = 86400,
        history_retention_s: int = 604800,
        cache_bytes: int = 64 * 1024 * 1024,
        service_namespace: str = "",
    ) -> None:
        self.store = store
        self.keys = keys
        self.tools = tools
        self._resolve_policy = resolve_policy
        self.default_fs_root = default_fs_root
        self.replica_id = replica_id
        self.max_open_transactions = max_open_transactions
        self.limits = Limits(max_txn_ops, max_request_bytes)
        self.txs = TxCache(cache_bytes)
        self.data = DataCache(cache_bytes // 4)
        self.loader = Loader(store, keys, self.txs, self.data)
        # History keys live on shared leases (engine.history): one per replica and time
        # bucket; the reaper keeps alive those open transactions pinned.
        self.history_lease = RetentionLease(store, history_retention_s)
        self.history_writer = HistoryWriter(keys, self.history_lease.lease_id)
        self.pinned_history = PinnedLeases(store, self.history_lease.bucket_s)
        self.undoer = Undoer(store, keys, tools, self.loader, self.txs, self.data, replica_id,
                             self.history_writer)
        self.steps = Stepper(store=store, keys=keys, tools=tools, loader=self.loader,
                             undoer=self.undoer, txs=self.txs, data=self.data,
                             limits=self.limits, replica_id=replica_id,
                             channel_names=channel_names)
        self.committer = Committer(store=store, keys=keys, loader=self.loader,
                                   undoer=self.undoer, txs=self.txs, data=self.data,
                                   dispatcher=dispatcher,
                                   retention=RetentionLease(store, effect_key_retention_s))
        self.approvals = ApprovalDesk(store=store, keys=keys, loader=self.loader,
                                      undoer=self.undoer, txs=self.txs,
                                      committer=self.committer,
                                      service_namespace=service_namespace)

    # ---- begin ---------------------------------------------------------------------------

    async def begin(self, agent_id: str, metadata: Mapping[str, str], overrides: dict[str, Any],
                    caller: Caller = ANONYMOUS) -> tuple[str, int]:
        try:
            policy = self._resolve_policy(agent_id, metadata, overrides, caller)
        except ValueError as exc:
            raise InvalidArgument(f"policy: {exc}") from None
        tx_id = str(uuid.uuid4())
        now = time.time()
        rollback = policy.rollback
        header = TxHeader(
            id=tx_id, principal=caller.principal, agent_id=agent_id, status=ACTIVE,
            policy=TxPolicy(rollback.max_local_depth, rollback.max_global_resets,
                            rollback.replay_budget_factor, policy.idle_timeout_s,
                            policy.sandbox_path or self.default_fs_root, policy.source),
            created_at=now, updated_at=now, approval=policy.approval,
            namespace=caller.namespace)
        note(tx=tx_id, agent_id=agent_id, policy=policy.source)
        hkey = self.keys.tx_header(tx_id)
        tried: set[int] = set()
        for attempt in range(SLOT_ATTEMPTS * 2):
            slot = await self._pick_slot(caller.principal, tried, attempt)
            tried.add(slot)
            placed = replace(header, quota_slot=slot)
            slot_key = self.keys.open_slot(caller.principal, slot)
            success = [Put(hkey, encode_header(placed)), Put(slot_key, tx_id.encode())]
            if metadata:
                success.append(Put(self.keys.tx_meta(tx_id), to_json(dict(metadata))))
            res = await self.store.txn([cmp_absent(hkey), cmp_absent(slot_key)], success,
                                       [Get(slot_key)], what="begin")
            if res.succeeded:
                self.txs.put(tx_id, TxState(header=placed, rev=res.revision, complete=True), 512)
                return tx_id, 1
            if res.first(0) is None:  # the slot was free: a UUID collision, never silently
                raise FailedPrecondition(f"transaction id {tx_id} already exists; retry")
        raise self._exhausted()

    async def _pick_slot(self, principal: str, tried: set[int], attempt: int) -> int:
        """A free open-transaction slot: random first (one round trip when the principal
        has room), then, after a few collisions, found by reading the slots in use."""
        limit = self.max_open_transactions
        if attempt < SLOT_ATTEMPTS:
            for _ in range(16):
                slot = random.randrange(limit)
                if slot not in tried:
                    return slot
        used = set(tried)
        prefix = self.keys.open_prefix(principal)
        count = 0
        async for page in self.store.pages(prefix, what="begin"):
            for kv in page:
                count += 1
                used.add(self.keys.slot_of(principal, kv.key))
        if count >= limit:
            raise self._exhausted()
        free = [s for s in range(limit) if s not in used]
        if not free:
            raise self._exhausted()
        return random.choice(free)

    def _exhausted(self) -> ResourceExhausted:
        return ResourceExhausted(
            f"max-open-transactions ({self.max_open_transactions}) reached for this principal; "
            "commit or roll back a transaction first")

    # ---- step / commit -------------------------------------------------------------------

    async def execute(self, tx_id: str, step_id: int, tool_name: str, arguments_json: str,
                      raw_context: str, caller: Caller = ANONYMOUS) -> StepOutcome:
        return await self.steps.execute(caller, tx_id, step_id, tool_name, arguments_json,
                                        raw_context)

    async def commit(self, tx_id: str, caller: Caller = ANONYMOUS) -> CommitOutcome:
        return await self.committer.commit(caller, tx_id)

    # ---- rollback ------------------------------------------------------------------------

    async def rollback(self, tx_id: str, to_step: int | None, reason: str,
                       caller: Caller = ANONYMOUS) -> RollbackOutcome:
        note(tx=tx_id, to_step=to_step, reason=reason[:200])
        abort = not to_step

        async def load() -> TxState:
            return await self.loader.for_step(tx_id, (), (), use_cache=False)

        async def judge(state: TxState) -> TxState:
            if not caller.admin:
                require_owner(state, caller)
            state = await self.undoer.settle(state)
            h = state.header
            # the step a toolset call of unknown outcome was for may be named too
            # (nothing is live there; the call is what is rolled back)
            in_flight = h.saga_pending.step_id if h.saga_pending is not None else 0
            if to_step and to_step >= h.next_step_id and to_step != in_flight:
                raise InvalidArgument(
                    f"to_step {to_step} is out of range: it must be lower than "
                    f"next_step_id {h.next_step_id} (or 0 to abort)")
            if to_step and h.status == AWAITING_APPROVAL:
                raise FailedPrecondition(
                    f"transaction {tx_id} awaits approval: roll it back entirely (no "
                    "to_step) to withdraw it, or wait for the decision")
            return state

        async def act(state: TxState) -> RollbackOutcome:
            h = state.header
            order = [i for i in reversed(h.live) if abort or i >= (to_step or 0)]
            records = await self.loader.records(state, order)
            started = time.perf_counter()
            ending = Ending(ABORTED, caller.principal, reason) if abort else None
            result = await self.undoer.run(state, records,
                                           Target(to_step or 0, abort, False, ending=ending,
                                                  release_unknown=True),
                                           base=replace(h, updated_at=time.time()))
            note(undone=result.done, errors=result.errors)
            strategy = "manual" if to_step else "abort"
            METRICS.rollbacks.labels(strategy).inc()
            METRICS.rollback_duration.labels(strategy).observe(time.perf_counter() - started)
            if result.errors:
                assert result.header is not None
                return RollbackOutcome(False, result.header.next_step_id, len(result.done),
                                       result.errors)
            if abort:
                METRICS.transactions_ended.labels("aborted").inc()
                if h.status == AWAITING_APPROVAL:
                    METRICS.approval_decisions.labels("withdrawn").inc()
                    note(withdrawn=True)
            return RollbackOutcome(True, 0 if abort else int(to_step or 0), len(result.done),
                                   [])

        def gave_up() -> Exception:
            return FailedPrecondition(f"transaction {tx_id} kept changing concurrently; retry")

        async with self.txs.locked(tx_id):
            return await on_current_state(self.txs, tx_id, load=load, judge=judge, act=act,
                                          on_stale=lambda stale, from_cache: False,
                                          gave_up=gave_up, attempts=4)

    # ---- get / list ----------------------------------------------------------------------

    async def get(self, tx_id: str, caller: Caller = ANONYMOUS) -> TransactionView:
        note(tx=tx_id)
        keys = self.keys
        hkey = keys.tx_header(tx_id)
        ctx = keys.context_prefix(tx_id)
        # Header, context log and the activity mark (for the idle reaper) in ONE etcd
        # transaction: the mark is written only while the header exists.
        res = await self.store.txn(
            [cmp_exists(hkey)],
            [Get(hkey), Get(ctx, prefix_end(ctx)), Put(keys.tx_touch(tx_id), str(time.time()).encode())],
            [], what="get")
        kv = res.first(0) if res.succeeded else None
        if kv is None:
            raise not_found(tx_id)
        h = decode_header(kv.value)
        if h.principal != caller.principal and not caller.admin:
            raise not_found(tx_id)
        if h.undoing is not None or (h.saga_pending is not None and h.status == ACTIVE) \
                or (h.fs_pending is not None and await write_interrupted(tx_id, h.fs_pending)):
            h = await self._settled_header(tx_id, h, kv.mod_revision)
        context = []
        for item in res.kvs(1):
            step = keys.step_of_context(tx_id, item.key)
            if step in h.live:
                tool, raw = decode_context(item.value)
                context.append(ContextItem(step, tool, raw))
        return TransactionView(h.id, h.status, h.next_step_id, list(h.constraints),
                               h.global_resets, h.agent_id, context, h.principal, h.created_at,
                               h.updated_at)

    async def _settled_header(self, tx_id: str, header: TxHeader, rev: int) -> TxHeader:
        """Finish a dead replica's half-done work before showing the state; while it is
        still in flight on a live replica, show the state as it stands."""
        async with self.txs.locked(tx_id):
            try:
                state = await self.loader.for_step(tx_id, (), (), use_cache=False)
                state = await self.undoer.settle(state)
                return state.header
            except FailedPrecondition:
                return header

    async def history(self, tx_id: str, caller: Caller = ANONYMOUS) -> TransactionHistory:
        """GetTransactionHistory: the owner's or an admin's view of an open transaction
        or of one that ended within the history retention; NOT_FOUND for anyone else,
        exactly as for an unknown id. One read (header, end record, entries)."""
        note(tx=tx_id)
        recorded = await hist.read(self.store, self.keys, tx_id)
        h, end = recorded.header, recorded.end
        if h is not None:
            view = TransactionHistory(h.id, h.status, h.agent_id, h.principal, h.created_at,
                                      0.0, "", "", 0, 0, [])
        elif end is not None:
            view = TransactionHistory(tx_id, end.status, end.agent_id, end.principal,
                                      end.created_at, end.ended_at, end.ended_by, end.reason,
                                      end.steps_committed, end.effects, [])
        else:
            raise NotFound(f"transaction {tx_id} not found (unknown, or its history is "
                           "older than the history retention)")
        if view.principal != caller.principal and not caller.admin:
            raise NotFound(f"transaction {tx_id} not found (unknown, or its history is "
                           "older than the history retention)")
        budget = self.limits.response_budget - history_header_bytes(view)
        view.steps = hist.fit(recorded.entries, budget)
        note(history_steps=len(view.steps))
        return view

    async def keep_history_alive(self, pinned: set[int]) -> int:
        """Keep the history of open transactions from expiring: `pinned` are the leases
        their headers name (the reaper calls it after each sweep)."""
        return await self.pinned_history.keep_alive(pinned)

    async def list(self, caller: Caller, *, page_size: int = 0, page_token: str = "",
                   status: str = "", agent_id_prefix: str = "") -> TransactionPage:
        """Open transactions, a page at a time, in id order: an admin's view holds every
        transaction, anyone else's only their own. Reads headers only."""
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        prefix = self.keys.headers_prefix()
        start = prefix + page_token.encode() + b"\x00" if page_token else None
        out: list[TransactionSummary] = []
        last = ""
        more = False
        async for page in self.store.pages(prefix, start=start, page_size=max(size, 64),
                                           what="list"):
            for kv in page:
                h = decode_header(kv.value)
                last = h.id
                if not caller.admin and h.principal != caller.principal:
                    continue
                if status and h.status != status:
                    continue
                if agent_id_prefix and not h.agent_id.startswith(agent_id_prefix):
                    continue
                out.append(TransactionSummary(h.id, h.status, h.agent_id, h.principal,
                                              h.next_step_id, h.created_at, h.updated_at))
                if len(out) >= size:
                    more = True
                    break
            if more:
                break
        note(listed=len(out))
        return TransactionPage(out, last if more else "")

    # ---- approvals (docs/approvals.md) ------------------------------------------------------

    async def list_approvals(self, caller: Caller = ANONYMOUS, *, page_size: int = 0,
                             page_token: str = "") -> ApprovalPage:
        """ListApprovals: the pending approvals the caller may decide."""
        return await self.approvals.list(caller, page_size=page_size, page_token=page_token,
                                         budget=self.limits.response_budget)

    async def decide(self, tx_id: str, digest: str, approve: bool, reason: str,
                     caller: Caller = ANONYMOUS) -> DecisionOutcome:
        """DecideApproval: approve (commit now) or reject (compensate) a pending approval."""
        return await self.approvals.decide(caller, tx_id, digest, approve, reason)

    async def expire_approval(self, tx_id: str, header_rev: int,
                              fence: Callable[[], Sequence[Compare]]) -> bool:
        """The reaper: reject a transaction whose approval timed out."""
        return await self.approvals.expire(tx_id, header_rev, fence)
    async def status(self) -> ServiceCounts:
        """GetServiceStatus' counts: count-only reads, never a value (engine.status)."""
        return await read_counts(self.store, self.keys)

    # ---- tools -----------------------------------------------------------------------------

    async def list_tools(self, caller: Caller = ANONYMOUS) -> Sequence[ToolDescription]:
        """The tools the caller may use, as ListTools shows them: built-ins, plug-ins and
        the toolsets in the caller's scope (docs/toolsets.md)."""
        out = list(describe_all(self.tools))
        if self.tools.source is not None:
            out += await self.tools.source.describe(Scope(caller.authenticated,
                                                          caller.namespace))
        return out

    # ---- reaper ----------------------------------------------------------------------------

    async def expire(self, tx_id: str, header_rev: int,
                     fence: Callable[[], Sequence[Compare]], idle_timeout_s: float = 0) -> bool:
        """Abort an idle transaction and compensate it. Every write carries `fence()`
        (the reaper's leadership compares), so a paused ex-leader cannot act. Returns
        False when the transaction moved on meanwhile (it is not idle any more). Its
        history says EXPIRED, ended by "reaper"."""
        async with self.txs.locked(tx_id):
            state = await self.loader.for_step(tx_id, (), (), use_cache=False)
            if state.rev != header_rev:
                return False
            try:  # a call a dead replica left half-done is finished first
                state = await self.undoer.settle(state)
            except (FailedPrecondition, NotFound):
                return False
            records = await self.loader.records(state, list(reversed(state.header.live)))
            idle = idle_timeout_s or state.header.policy.idle_timeout_s
            ending = Ending(EXPIRED, "reaper", f"no call for {idle:g} s (idle timeout)")
            try:
                result = await self.undoer.run(state, records,
                                               Target(0, True, False, ending=ending),
                                               fence=fence)
            except Stale:
                return False
            if result.errors:
                log.error("idle transaction could not be compensated",
                          extra={"tx": tx_id, "errors": result.errors})
                return False
            METRICS.transactions_ended.labels("expired").inc()
            log.info("idle transaction expired", extra={"tx": tx_id, "undone": result.done})
            return True


__all__ = ["Engine"]
