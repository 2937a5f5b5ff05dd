"""Undoing steps, and finishing what a dead replica left half-done.

A rollback (automatic after a failed step, requested, an abort, an expiry, a commit
conflict's compensation) undoes live steps newest first. Journal steps (kv, records)
and staged effects are undone by the rollback's CAS alone: their buffered writes are
restored in the touched entries and their records dropped. Steps that changed the world
(fs.write, custom sagas) need actions first, so for them an intent (`UndoIntent`, in the
header) is committed before touching anything, then the actions run, then the final
CAS; a replica that dies in between leaves a durable plan that any replica resumes
(`settle`). Undo actions are idempotent, so resuming is safe. If an action fails, the
rollback stops there and the transaction waits for RollbackTransaction (SPEC §5 MANUAL).

`settle` also finishes a toolset saga call that a replica began but did not record
(`SagaPending`, docs/toolsets.md "Crash windows"): nobody can know whether the upstream
acted, so the call's compensation runs when it can be built from the call's arguments
alone (the step then counts as not applied), and otherwise the transaction waits for a
manual rollback with a compensation error naming the call, its arguments and its
idempotency key. The settling replica first takes the intent over (one CAS), so two
replicas never both compensate it; the compensation is sent with the same idempotency
key on every try, so an upstream that honours keys acts once even if a settler dies
between the compensation and its record.

`settle` also decides the fate of an fs.write whose rename may not have happened
(`FsPending`). The decision never looks at the target's contents: once `ExecuteStep`
answered SUCCESS the step is final, whatever someone else does to the file afterwards
(docs/recovery.md, "An acknowledged step is final"). What tells an interrupted write from
a completed one is the step's own temp file (named after its transaction, step and
attempt): the atomic rename removes it, so "temp file present" means the rename never
happened. Such a write is rolled back as if it never ran, once its owner is gone or the
grace period passed; a write whose temp file is gone is settled as applied.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import failpoints
from ..contracts.layout import Keys
from ..contracts.toolsets import TIMEOUT_MAX_S
from ..errors import FailedPrecondition, NotFound
from ..observability import tracing
from ..observability.context import note
from ..observability.metrics import METRICS
from ..store.ops import Compare, KeyValueStore, Put, TxnResult
from ..tools.base import ToolError
from ..tools.registry import ToolRegistry
from . import sandbox
from .cache import DataCache, TxCache, TxState
from .history import ABORTED, Ending, HistoryEntry, HistoryWriter
from .limits import add_constraint
from .ops import TxnPlan, abort_plan, read_back_keys, rollback_plan, undone_entries
from .snapshot import Loader, not_found
from .state import (
    ACTIVE,
    AWAITING_ROLLBACK,
    FsPending,
    SagaPending,
    StepRecord,
    Touched,
    TxHeader,
    UndoIntent,
    decode_header,
    from_json,
)

log = logging.getLogger(__name__)

# How long an fs.write may sit between its CAS and its rename (or a rollback between its
# intent and its end) before another replica may treat it as interrupted; the owner's
# liveness key is checked too, so a dead owner is taken over sooner.
APPLY_GRACE_S = 30.0


class Stale(Exception):
    """A CAS lost its compare: nothing was written. `header` is the transaction's current
    header when it changed (the cached state was stale), None when only a key the step
    assumed had changed (the state is still current; the step runs again)."""

    def __init__(self, header: TxHeader | None) -> None:
        super().__init__("stale")
        self.header = header


@dataclass(frozen=True)
class Target:
    """Where a rollback leads when every undo action succeeds."""

    next_step_id: int
    end: bool
    automatic: bool
    global_resets: int | None = None
    replay_used: int | None = None
    ending: Ending | None = None     # end: how (default: aborted by the owner, no reason)
    # RollbackTransaction: a person (or the agent) saw the MANUAL answer about a toolset
    # call of unknown outcome whose compensation needs its output, and asks to go on.
    release_unknown: bool = False


@dataclass
class UndoResult:
    errors: list[str]
    done: list[int]
    header: TxHeader | None          # the header written (None: the transaction ended)


class Undoer:
    def __init__(self, store: KeyValueStore, keys: Keys, tools: ToolRegistry, loader: Loader,
                 txs: TxCache, data: DataCache, replica_id: str,
                 history: HistoryWriter) -> None:
        self.store, self.keys, self.tools, self.loader = store, keys, tools, loader
        self.txs, self.data, self.replica_id = txs, data, replica_id
        self.history = history

    # ---- CAS bookkeeping ---------------------------------------------------------------

    def lost(self, state: TxState, plan: TxnPlan, res: TxnResult, what: str) -> Stale:
        """Learn from a lost compare (the plan's failure branch read everything it
        compared) and say whether the state is stale."""
        METRICS.cas_conflicts.labels(what).inc()
        tx = state.header.id
        header_kv = res.first(0)
        if header_kv is None:
            self.txs.evict(tx)
            raise not_found(tx)
        if header_kv.mod_revision != state.rev:
            self.txs.evict(tx)
            return Stale(decode_header(header_kv.value))
        for i, key in enumerate(read_back_keys(self.keys.tx_header(tx), plan.compares)[1:], 1):
            self.data.remember(key, res.first(i))
        return Stale(None)

    async def send(self, state: TxState, plan: TxnPlan, what: str) -> TxnResult:
        res = await self.store.txn(plan.compares, plan.success, plan.failure, what=what)
        if not res.succeeded:
            raise self.lost(state, plan, res, what)
        return res

    # ---- rollback ----------------------------------------------------------------------

    async def run(self, state: TxState, records: Sequence[StepRecord], target: Target, *,
                  base: TxHeader | None = None,
                  fence: Callable[[], Sequence[Compare]] = lambda: (),
                  observed: Mapping[bytes, int] | None = None,
                  observations: Mapping[bytes, Touched] | None = None,
                  failed: HistoryEntry | None = None) -> UndoResult:
        """Undo `records` (a suffix of the live steps, newest first) and commit the state
        that results (`target`, or the end of the transaction). `base` is the header to
        build on (the caller's changes: constraints, attempts...); `observed` and
        `observations` are a failed step's first reads, validated and recorded in the
        same CAS, and `failed` its history entry, written by the first CAS (and again
        by the last as MANUAL when an undo fails). Raises Stale when the transaction (or
        an assumed key) changed first."""
        header = base or state.header
        rev = state.rev
        steps = tuple(r.step_id for r in records)
        read_new = len(observations or {})
        if read_new:
            header = replace(header, budget=replace(header.budget,
                                                     read_keys=header.budget.read_keys + read_new))
        seq = header.history_seq
        pending: list[Put] = []
        if failed is not None:
            put, header = await self.history.entry(header, failed)
            pending = [put]
        ending = (target.ending or Ending(ABORTED, header.principal)).cut()
        saga = header.saga_pending
        intent_needed = saga is not None or any(r.fs is not None or r.has_saga for r in records)
        if intent_needed:
            intent = UndoIntent(steps, self.replica_id, time.time(), target.end,
                                target.automatic, target.next_step_id,
                                target.global_resets if target.global_resets is not None
                                else header.global_resets,
                                target.replay_used if target.replay_used is not None
                                else header.replay_used,
                                (ending.status, ending.ended_by, ending.reason)
                                if target.end else None)
            marked = replace(header, undoing=intent, updated_at=time.time())
            plan = rollback_plan(self.keys, state.header, rev, marked, (), fence=fence(),
                                 observations=observations, observed=observed,
                                 history=pending)
            res = await self.send(state, plan, "undo intent")
            header, rev = marked, res.revision
            observed, observations, pending = None, None, []
            failpoints.hit("undo.after_intent")
        started = time.perf_counter()
        saga_error = None if saga is None else await self._undo_saga_call(
            state.header.id, saga, release_unknown=target.release_unknown and saga.reported)
        done: list[int]
        if saga_error is not None:
            errors, done = [saga_error], []
        else:
            errors, done = await self.undo_actions(state.header.id, records)
        failpoints.hit("undo.after_restore")
        done_records = [r for r in records if r.step_id in done]
        budget = header.budget
        for r in done_records:
            budget = budget.minus_undone(r.delta)
        now = time.time()
        if errors:
            new = replace(header, status=AWAITING_ROLLBACK, attempts=0, undoing=None,
                          fs_pending=None, pending=None, budget=budget, updated_at=now,
                          saga_pending=None if saga is None or saga_error is None else
                          replace(saga, reported=saga.reported or target.release_unknown),
                          next_step_id=min(done) if done else header.next_step_id,
                          replay_used=header.replay_used + (len(done) if target.automatic else 0))
            if failed is not None:  # the step's answer says MANUAL: so does its entry
                pending = [self.history.rewrite(header, seq, replace(
                    failed, status="ROLLBACK_TRIGGERED", strategy="MANUAL"))]
            plan = rollback_plan(self.keys, header, rev, new, done_records, fence=fence(),
                                 observations=observations, observed=observed,
                                 history=pending)
            await self._final(state, plan, intent_needed)
            self._cache(state, new, done_records)
            log.warning("undo failed; transaction awaits manual rollback",
                        extra={"tx": state.header.id, "errors": errors, "undone": done})
            return UndoResult(errors, done, new)
        if target.end:
            plan = abort_plan(self.keys, header, rev,
                              locks=[r.fs.lock_key for r in done_records
                                     if r.fs is not None and r.fs.lock_new],
                              reservations=[k for r in done_records for k in r.effect_keys],
                              fence=fence(), observed=observed,
                              history=[*pending, await self.history.end(header, ending)])
            await self._final(state, plan, intent_needed)
            self.txs.evict(state.header.id)
            note(undo_ms=round((time.perf_counter() - started) * 1000, 2))
            return UndoResult([], done, None)
        new = replace(header, status=ACTIVE, next_step_id=target.next_step_id, attempts=0,
                      undoing=None, fs_pending=None, saga_pending=None, pending=None,
                      budget=budget,
                      updated_at=now,
                      global_resets=header.global_resets if target.global_resets is None
                      else target.global_resets,
                      replay_used=header.replay_used if target.replay_used is None
                      else target.replay_used)
        plan = rollback_plan(self.keys, header, rev, new, done_records, fence=fence(),
                             observations=observations, observed=observed, history=pending)
        res = await self._final(state, plan, intent_needed)
        self._cache(state, new, done_records, res.revision, observations)
        return UndoResult([], done, new)

    async def _final(self, state: TxState, plan: TxnPlan, after_intent: bool) -> TxnResult:
        res = await self.store.txn(plan.compares, plan.success, plan.failure, what="state")
        if not res.succeeded:
            if after_intent:  # someone took our intent over (we looked dead): their turn
                self.txs.evict(state.header.id)
                raise FailedPrecondition(
                    f"transaction {state.header.id} was changed concurrently during its "
                    "rollback; re-read it with GetTransaction")
            raise self.lost(state, plan, res, "rollback")
        return res

    def _cache(self, state: TxState, header: TxHeader, done: Sequence[StepRecord],
               rev: int = 0, observations: Mapping[bytes, Touched] | None = None) -> None:
        """Carry a rollback into the cached state (or drop it when unsure)."""
        tx = header.id
        if not rev or self.txs.get(tx) is not state:
            self.txs.evict(tx)
            return
        state.header, state.rev = header, rev
        for dk, entry in {**(observations or {}), **undone_entries(done)}.items():
            state.entries[dk] = entry
        for r in done:
            state.records.pop(r.step_id, None)
            state.outputs.pop(r.step_id, None)
            state.effects.pop(r.step_id, None)
        state.fs_settled = True

    async def undo_actions(self, tx_id: str, records: Sequence[StepRecord]
                           ) -> tuple[list[str], list[int]]:
        """Run undo actions newest first; stop at the first failure (SPEC §5 MANUAL).
        Returns (compensation errors, steps undone)."""
        errors: list[str] = []
        done: list[int] = []
        for r in records:
            try:
                with tracing.undo_span(r.tool, r.step_id):
                    await self._undo_one(tx_id, r)
            except Exception as exc:
                errors.append(f"step {r.step_id} ({r.tool}): {_describe(exc, r)}")
                break
            done.append(r.step_id)
        return errors, done

    async def _undo_one(self, tx_id: str, r: StepRecord) -> None:
        if r.fs is not None:
            target = pathlib.Path(r.fs.target)
            await asyncio.to_thread(sandbox.discard_temp,
                                    sandbox.temp_name(target, tx_id, r.step_id, r.attempt))
            await asyncio.to_thread(sandbox.restore, target,
                                    r.fs.previous if r.fs.existed else None)
        if r.has_saga:
            tool = self.tools.get(r.tool)
            if tool is None:
                raise RuntimeError(f"tool {r.tool} is no longer installed")
            await tool.compensate(r.saga)
        # journal (kv/record) and effects: the rollback's CAS is the undo.

    # ---- what a dead replica left ------------------------------------------------------

    async def settle(self, state: TxState) -> TxState:
        """Finish an interrupted rollback or fs.write before serving a call on `state`.
        Both are rare and cost nothing when absent. Returns the state to go on with."""
        h = state.header
        if h.undoing is not None:
            return await self._resume(state, h.undoing)
        if h.saga_pending is not None and h.status == ACTIVE:
            g = h.saga_pending
            if await self._busy_saga(g):
                raise FailedPrecondition(f"step {g.step_id} of transaction {h.id} is calling "
                                         "its upstream; retry shortly")
            state, _ = await self.settle_saga(state)
            return state
        if h.fs_pending is not None and not state.fs_settled:
            return await self._settle_write(state)
        return state

    async def _resume(self, state: TxState, intent: UndoIntent) -> TxState:
        tx = state.header.id
        if await self._busy(intent.owner, intent.since):
            raise FailedPrecondition(f"a rollback of transaction {tx} is in progress; "
                                     "retry shortly")
        live = state.header.live
        steps = [s for s in intent.steps if s in live]
        log.warning("resuming an interrupted rollback",
                    extra={"tx": tx, "steps": steps, "owner": intent.owner})
        records = await self.loader.records(state, steps)
        base = replace(state.header, undoing=None)
        ending = Ending(*intent.ending) if intent.ending is not None else None
        result = await self.run(state, records, Target(intent.next_step_id, intent.end,
                                                       intent.automatic, intent.global_resets,
                                                       intent.replay_used, ending), base=base)
        if intent.end and not result.errors:
            raise not_found(tx)
        return await self.loader.for_step(tx, (), (), use_cache=False)

    async def _settle_write(self, state: TxState) -> TxState:
        f = state.header.fs_pending
        assert f is not None
        tx = state.header.id
        if not await write_interrupted(tx, f):
            state.fs_settled = True  # the write landed; the next state change clears it
            return state
        if await self._busy(f.owner, f.since):
            raise FailedPrecondition(f"step {f.step_id} of transaction {tx} is still being "
                                     "applied; retry shortly")
        live = state.header.live
        records = await self.loader.records(state, [f.step_id] if f.step_id in live else [])
        result = await self.run(state, records, Target(f.step_id, False, False))
        log.warning("recovered an interrupted fs.write",
                    extra={"tx": tx, "step": f.step_id, "errors": result.errors})
        return await self.loader.for_step(tx, (), (), use_cache=False)

    # ---- toolset saga calls of unknown outcome -------------------------------------------

    async def settle_saga(self, state: TxState, *, hint: str | None = None,
                          reported: bool = False) -> tuple[TxState, list[str]]:
        """Decide a `SagaPending` step nobody recorded: compensate it from its arguments
        (the step is then not applied), or hold the transaction for a manual rollback.
        Returns the state (updated in place) and the compensation errors (non-empty:
        the transaction now awaits RollbackTransaction; `reported`: the caller answers
        them, so the next RollbackTransaction may release a call that needs a person).
        `hint` (the failed call's) is added to the constraints. Raises
        FailedPrecondition when another replica took the intent over first."""
        g = state.header.saga_pending
        assert g is not None
        tx = state.header.id
        if g.owner != self.replica_id:
            now = time.time()
            # the compensation is one upstream call: it ends within twice the longest
            # timeout a toolset may set (and a dead settler's liveness key ends sooner)
            mine = replace(g, owner=self.replica_id, since=now,
                           until=now + 2 * TIMEOUT_MAX_S + APPLY_GRACE_S)
            await self._header_cas(state, replace(state.header, saga_pending=mine),
                                   "saga takeover")
            g = mine
        intent = await self._intent(tx, g)
        error = await self._undo_saga_call(tx, g, release_unknown=False, intent=intent)
        h = state.header
        constraints = add_constraint(h.constraints, hint) if hint else h.constraints
        now = time.time()
        if error is not None:
            key = intent.get("key") if intent else None
            constraints = add_constraint(constraints, (
                f"Step {g.step_id} may have acted on its upstream without being recorded "
                f"(idempotency key {key}); AgentTx could not undo it: check the upstream, then "
                "call RollbackTransaction.")[:200])
            new = replace(h, status=AWAITING_ROLLBACK, attempts=0, constraints=constraints,
                          updated_at=now, saga_pending=replace(g, reported=reported))
        else:
            new = replace(h, saga_pending=None, constraints=constraints, updated_at=now)
        await self._header_cas(state, new, "saga settle")
        log.warning("settled a toolset call nobody recorded",
                    extra={"tx": tx, "step": g.step_id, "compensated": error is None,
                           "error": error})
        return state, [error] if error is not None else []

    async def _header_cas(self, state: TxState, new: TxHeader, what: str) -> None:
        plan = rollback_plan(self.keys, state.header, state.rev, new, ())
        res = await self.store.txn(plan.compares, plan.success, plan.failure, what=what)
        if not res.succeeded:
            self.txs.evict(state.header.id)
            raise FailedPrecondition(f"transaction {state.header.id} was changed concurrently "
                                     "while a toolset call was being settled; retry")
        state.header, state.rev = new, res.revision

    async def _intent(self, tx_id: str, g: SagaPending) -> dict[str, Any] | None:
        """The call `g` marks (`tx/<id>/intent`), None if unreadable or another's."""
        kv = await self.store.get(self.keys.saga_intent(tx_id), what="load")
        if kv is None:
            return None
        doc = from_json(kv.value)
        if isinstance(doc, dict) and (doc.get("step"), doc.get("attempt")) == \
                (g.step_id, g.attempt):
            return doc
        return None

    async def _undo_saga_call(self, tx_id: str, g: SagaPending, release_unknown: bool,
                              intent: dict[str, Any] | None = None) -> str | None:
        """Compensate the toolset call `g` marks; returns the compensation error, or None
        when it is undone (or released: a RollbackTransaction after one that reported
        it, i.e. a person was told to check the upstream)."""
        if intent is None:
            intent = await self._intent(tx_id, g)
        name = str(intent.get("name")) if intent else "?"
        where = f"step {g.step_id} ({name})"
        if intent is not None and intent.get("compensation") is not None:
            tool = self.tools.get(name)
            try:
                with tracing.undo_span(name, g.step_id):
                    if tool is None:
                        raise RuntimeError(f"tool {name} is no longer available")
                    await tool.compensate(intent["compensation"])
            except Exception as exc:
                return f"{where}: {_message(exc)}"
            return None
        if release_unknown:
            log.warning("RollbackTransaction released a toolset call of unknown outcome",
                        extra={"tx": tx_id, "step": g.step_id, "tool": name})
            return None
        if intent is None:
            return (f"{where}: a toolset call may have acted without being recorded and its "
                    "intent is unreadable; check the upstream, then call RollbackTransaction")
        call = json.dumps(intent.get("arguments"), ensure_ascii=False, sort_keys=True)
        comp = intent.get("compensate") or {}
        return (f"{where} may have acted on its upstream without being recorded: {name} "
                f"{call} (idempotency key {intent.get('key')}); its compensation "
                f"{comp.get('tool')} needs the call's output, so AgentTx cannot undo it: "
                "check the upstream, undo it by hand if it acted, then call "
                "RollbackTransaction again")

    async def _busy_saga(self, g: SagaPending) -> bool:
        """Is the replica that made the call still within it? (Calls on one transaction
        are serialised within a replica, so our own marker was abandoned.)"""
        if g.owner == self.replica_id or time.time() >= g.until:
            return False
        return await self.store.get(self.keys.replica(g.owner), what="load") is not None

    async def _busy(self, owner: str, since: float) -> bool:
        """Is the owner of a marker still within its window? Calls on one transaction
        are serialised within a replica (TxCache.locked), so a marker of this replica's
        own is never in progress while another of its calls looks at it: it was
        abandoned (a CAS that timed out) and can be settled right away."""
        if time.time() - since >= APPLY_GRACE_S or owner == self.replica_id:
            return False
        return await self.store.get(self.keys.replica(owner), what="load") is not None


async def write_interrupted(tx_id: str, pending: FsPending) -> bool:
    """Did the pending write stop before its rename? True iff its temp file is still
    there (the rename is what removes it). Independent of the target's contents, so an
    outside change to an acknowledged file never makes its step look interrupted."""
    tmp = sandbox.temp_name(pathlib.Path(pending.target), tx_id, pending.step_id,
                            pending.attempt)
    return await asyncio.to_thread(os.path.lexists, tmp)


def _describe(exc: BaseException, r: StepRecord) -> str:
    if isinstance(exc, OSError) and r.fs is not None:
        return f"cannot restore '{r.fs.path}': {exc.strerror or exc}"
    return _message(exc)


def _message(exc: BaseException) -> str:
    """A tool's own ToolError is worded for people already; anything else says its type."""
    if isinstance(exc, ToolError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


__all__ = ["APPLY_GRACE_S", "NotFound", "Stale", "Target", "UndoResult", "Undoer",
           "write_interrupted"]
