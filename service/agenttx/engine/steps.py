"""ExecuteStep: run a tool on the transaction's view, then record the outcome in ONE CAS.

The common case is one etcd round trip: the replica runs the step on its cached state of
the transaction and CASes on the header's mod_revision, with a compare for every key the
step touched for the first time (`view.StepView`). A compare that fails changed
nothing; the engine learns what was really there (the CAS's failure branch) and runs the
step again — never a blind retry. A replica whose cache is stale (another replica
advanced the transaction) reloads; if the step it was asked to run is no longer the
next one, it answers FAILED_PRECONDITION: exactly one winner per step.

A failed step is a normal answer: the error is cleaned into (category, hint), the
planner (pure) picks the strategy, and undo.Undoer carries it out.

Custom saga tools change the world inside `execute`, before the CAS, so they never run
on an assumption: their state is read fresh, and a step whose record does not land is
compensated (docs/recovery.md). Toolset saga tools (docs/toolsets.md) instead record a
durable intent before their call (`_write_intent`, one CAS that also validates the cached
state), so a call whose step is not recorded is settled from that intent by whichever
replica finds it (undo.Undoer.settle_saga), never compensated twice.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import failpoints
from ..args.jsonargs import dumps
from ..args.refs import Reference, ReferenceError_, offending_step
from ..cleaner import clean_error
from ..contracts.layout import Keys
from ..contracts.outbox import DEFERRED_CHANNEL
from ..errors import FailedPrecondition, NotFound, StoreUnavailable
from ..observability import tracing
from ..observability.context import note
from ..observability.metrics import METRICS
from ..store.ops import KeyValue
from ..tools.base import OutcomeUnknown, RollbackKind, Tool, ToolError, validate_arguments
from ..tools.registry import Scope, ToolRegistry
from . import sandbox
from .arguments import parse_step_arguments, resolve_step_arguments
from .cache import DataCache, TxCache, TxState
from .current import on_current_state
from .history import ABORTED, Ending, HistoryEntry
from .limits import Limits, add_constraint, check_step, context_cost
from .model import Caller, StepOutcome
from .ops import (
    StepChanges,
    TxnPlan,
    fence_unknown_step_plan,
    intent_plan,
    is_data_key,
    observation_entries,
    step_entries,
    step_plan,
)
from .planner import (
    FailureFacts,
    PolicyLimits,
    StepTouch,
    Strategy,
    find_culprit,
    find_dependencies,
    plan_rollback,
)
from .snapshot import Loader, not_found
from .state import (
    ACTIVE,
    AWAITING_APPROVAL,
    AWAITING_ROLLBACK,
    Budget,
    FsPending,
    GatedCall,
    SagaPending,
    StagedEffect,
    StepRecord,
    Touched,
    TxHeader,
    UndoImage,
    decode_header,
    decode_step,
    encode_gated,
    to_json,
)
from .undo import Stale, Target, Undoer
from .view import StepView

log = logging.getLogger(__name__)

# A step whose assumptions keep being invalidated by concurrent commits gives up after
# this many attempts (each one definitive: its CAS changed nothing).
MAX_ATTEMPTS = 8


def is_custom_saga(tool: Tool | None) -> bool:
    """SAGA tools other than fs.write (whose undo the engine does itself from its record)."""
    return tool is not None and tool.rollback is RollbackKind.SAGA and tool.name != "fs.write"


def has_intent(tool: Tool | None) -> bool:
    """SAGA tools that record a durable intent before acting (toolset sagas)."""
    return is_custom_saga(tool) and bool(getattr(tool, "durable_intent", False))


def require_owner(state: TxState, caller: Caller) -> None:
    """Ownership (docs/security.md#ownership-and-admins): another principal's transaction does not exist
    for the caller."""
    if state.header.principal != caller.principal:
        raise not_found(state.header.id)


def require_active(header: TxHeader) -> None:
    if header.status == AWAITING_ROLLBACK:
        raise FailedPrecondition(
            f"transaction {header.id} is waiting for a manual rollback: an undo action "
            "failed; call RollbackTransaction")
    if header.status == AWAITING_APPROVAL:
        digest = header.pending.digest if header.pending is not None else ""
        raise FailedPrecondition(
            f"transaction {header.id} awaits approval (digest {digest}): no more steps or "
            "commits; an approver decides it (DecideApproval), or RollbackTransaction "
            "withdraws it")
    if header.status != ACTIVE:
        raise FailedPrecondition(f"transaction {header.id} is {header.status}")


@dataclass(frozen=True)
class StepRequest:
    """What ExecuteStep asked for, parsed once: the same for every attempt at it."""

    caller: Caller
    tx_id: str
    step_id: int
    tool_name: str
    tool: Tool | None
    arguments_json: str
    parsed: dict[str, Any] | None
    parse_error: str | None
    references: list[Reference]
    ref_steps: set[int]
    raw_context: str
    fresh: bool                      # a custom saga: never run on a cached assumption
    # the tool names this caller may use (an unknown tool's hint suggests among them)
    known_tools: Callable[[], list[str]] = list


@dataclass
class Attempt:
    """One run of the tool: the request, the state it ran on, what it saw and did."""

    request: StepRequest
    state: TxState
    view: StepView
    refs: set[int] = field(default_factory=set)
    provenance: dict[str, int] = field(default_factory=dict)
    result: Any = None
    arguments: Any = None            # resolved (references expanded), once they are

    @property
    def header(self) -> TxHeader:
        return self.state.header

    @property
    def step_id(self) -> int:
        return self.request.step_id

    @property
    def tool(self) -> Tool | None:
        return self.request.tool


@dataclass(frozen=True)
class Applied:
    """A successful attempt, ready for its CAS: the record, the header after it, the
    changes as the view recorded them, the plan and the encoded output."""

    record: StepRecord
    header: TxHeader
    changes: StepChanges
    plan: TxnPlan
    output_json: str


class Stepper:
    def __init__(self, *, store: Any, keys: Keys, tools: ToolRegistry, loader: Loader,
                 undoer: Undoer, txs: TxCache, data: DataCache, limits: Limits,
                 replica_id: str, channel_names: Callable[[], list[str]]) -> None:
        self.store, self.keys, self.tools, self.loader = store, keys, tools, loader
        self.undoer, self.txs, self.data, self.limits = undoer, txs, data, limits
        self.replica_id, self.channel_names = replica_id, channel_names
        self._background: set[asyncio.Task[None]] = set()

    async def execute(self, caller: Caller, tx_id: str, step_id: int, tool_name: str,
                      arguments_json: str, raw_context: str) -> StepOutcome:
        scope = Scope(caller.authenticated, caller.namespace)
        tool = self.tools.lookup(tool_name, scope)
        parsed, parse_error, references = await parse_step_arguments(arguments_json)
        request = StepRequest(
            caller=caller, tx_id=tx_id, step_id=step_id, tool_name=tool_name, tool=tool,
            arguments_json=arguments_json, parsed=parsed, parse_error=parse_error,
            references=references, ref_steps={r.step for r in references if r.step is not None},
            raw_context=raw_context,
            # an intent's CAS validates the cached state before anything is called
            fresh=is_custom_saga(tool) and not has_intent(tool),
            known_tools=lambda: self.tools.names_in(scope))
        note(tx=tx_id, step=step_id, tool=tool_name)

        async def load() -> TxState:
            return await self.loader.for_step(tx_id, request.ref_steps,
                                              self._prefetch(tool, parsed), use_cache=False)

        async def judge(state: TxState) -> TxState:
            require_owner(state, caller)
            state = await self.undoer.settle(state)
            require_active(state.header)
            if step_id != state.header.next_step_id:
                raise FailedPrecondition(
                    f"step_id {step_id} is out of order: transaction {tx_id} expects "
                    f"step {state.header.next_step_id}")
            return state

        async def act(state: TxState) -> StepOutcome:
            with tracing.tool_span(tool_name, tx_id, step_id):
                return await self._run(request, state)

        def on_stale(stale: Stale, from_cache: bool) -> bool:
            current = stale.header
            if current is not None and current.status == AWAITING_APPROVAL:
                require_active(current)  # says that it awaits approval, and what to do
            if current is not None and (current.next_step_id != step_id
                                        or current.status != ACTIVE):
                raise FailedPrecondition(
                    f"step {step_id} lost a race: transaction {tx_id} was changed "
                    f"concurrently and now expects step {current.next_step_id}") from None
            return current is None and not request.fresh

        def gave_up() -> Exception:
            return StoreUnavailable(f"step {step_id} of transaction {tx_id} kept meeting "
                                    "concurrent changes to the keys it reads; retry the step")

        async with self.txs.locked(tx_id):
            return await on_current_state(self.txs, tx_id, load=load, judge=judge, act=act,
                                          on_stale=on_stale, gave_up=gave_up,
                                          attempts=MAX_ATTEMPTS, use_cache=not request.fresh)

    def _prefetch(self, tool: Tool | None, parsed: dict[str, Any] | None) -> list[bytes]:
        """Data keys a tool names literally, read with the header on a cache miss."""
        if tool is None or parsed is None:
            return []
        try:
            wanted = tool.prefetch(parsed)
        except Exception:  # an optimisation; a bad shape fails later, with its message
            return []
        out: list[bytes] = []
        for kind, value in wanted:
            if kind == "kv" and isinstance(value, str):
                out.append(self.keys.kv(value))
            elif kind == "rec":
                table, rid = value
                out.append(self.keys.record(table, rid))
        return out[:64]

    # ---- one attempt -------------------------------------------------------------------

    async def _run(self, request: StepRequest, state: TxState) -> StepOutcome:
        h = state.header
        nonce = sandbox.new_attempt()
        tool = request.tool

        async def record_intent(intent: dict[str, Any], timeout_s: float) -> None:
            await self._write_intent(state, request.step_id, nonce, intent, timeout_s)

        view = StepView(keys=self.keys, state=state, data=self.data,
                        fetch=lambda e, d: self.loader.fetch(h.id, e, d),
                        step_id=request.step_id, attempt=nonce,
                        owner=h.principal, channel_names=self.channel_names,
                        fresh=request.fresh,
                        record_intent=record_intent if has_intent(tool) else None)
        attempt = Attempt(request, state, view)
        if tool is not None and tool.name.startswith("fs."):
            await asyncio.to_thread(pathlib.Path(h.policy.fs_root).mkdir, parents=True,
                                    exist_ok=True)
        try:
            if request.parse_error is not None:
                raise ToolError(request.parse_error)
            if tool is None:
                raise ToolError(f"function {request.tool_name}() does not exist",
                                category="undefined_function")
            outputs = await self.loader.outputs(state, request.ref_steps)
            try:
                resolution = await resolve_step_arguments(request.parsed, outputs, h.live,
                                                          request.references)
            except ReferenceError_ as exc:
                attempt.refs = set(exc.referenced)
                raise ToolError(exc.message, argument=exc.argument) from None
            attempt.refs, attempt.provenance = set(resolution.referenced), resolution.provenance
            attempt.arguments = resolution.value
            args = validate_arguments(resolution.value, tool.fields)
            attempt.result = await tool.execute(args, view)
            applied = await self._success(attempt, attempt.result.output)
        except OutcomeUnknown as exc:
            return await self._outcome_unknown(attempt, exc)
        except ToolError as exc:
            return await self._failed(attempt, exc.message, exc.argument, exc.data,
                                      category=exc.category)
        except (Stale, NotFound, FailedPrecondition, StoreUnavailable):
            await view.discard()
            await self._compensate_unrecorded(attempt)
            raise
        except Exception as exc:  # a custom tool's own failure: its text is the message
            log.info("tool raised", extra={"tx": h.id, "tool": request.tool_name,
                                           "error": f"{type(exc).__name__}: {exc}"})
            return await self._failed(attempt, str(exc) or type(exc).__name__, None, None)
        return await self._apply(attempt, applied)

    async def _success(self, attempt: Attempt, output: Any) -> Applied:
        request, state, view = attempt.request, attempt.state, attempt.view
        h = state.header
        output_json = dumps(output)  # encoded once: response, record and size check
        output_raw = output_json.encode()
        known = self._known(state, view)
        entries = step_entries(view.before, view.states, view.observed, known)
        delta = _delta(view, known, entries, request.tool_name, request.raw_context)
        gated = _gated(h, request.step_id, request.tool_name, attempt.arguments, view.effects)
        if gated:
            delta = replace(delta, gated_bytes=sum(len(encode_gated(g)) for g in gated))
        fs = view.fs
        record = StepRecord(
            step_id=request.step_id, tool=request.tool_name, attempt=view.attempt,
            output=output, refs=tuple(sorted(attempt.refs)),
            undo=tuple(UndoImage(dk, obs, st) for dk, (obs, st) in view.before.items()),
            effect_keys=tuple(view.effect_keys), effects=len(view.effects),
            fs=fs.record if fs is not None else None,
            saga=attempt.result.compensation if attempt.result is not None else None,
            has_saga=is_custom_saga(request.tool),
            context_bytes=delta.context_bytes, delta=delta)
        now = time.time()
        new_header = replace(
            h, next_step_id=request.step_id + 1, attempts=0,
            highest_step=max(h.highest_step, request.step_id), updated_at=now,
            budget=h.budget.plus(delta), saga_pending=None,
            fs_pending=FsPending(request.step_id, view.attempt, self.replica_id, now,
                                 fs.record.target) if fs is not None else None)
        changes = StepChanges(observed=view.observed, entries=entries, assumed=view.assumed,
                              effects=view.effects,
                              reservations=view.effect_keys, lock_new=view.lock_new,
                              lock_held=view.lock_held)
        entry = HistoryEntry.of(request.step_id, request.tool_name, "SUCCESS",
                                arguments_json=request.arguments_json, output_json=output_json)
        put, new_header = await self.undoer.history.entry(new_header, entry)
        plan = step_plan(self.keys, h, state.rev, new_header, record, request.raw_context,
                         changes, history=[put], gated=gated, output=output_raw)
        message = check_step(self.limits, new_header.budget, step_compares=len(plan.compares),
                             step_ops=len(plan.success), step_bytes=plan.request_bytes,
                             output_bytes=len(output_raw), constraints=h.constraints,
                             approval=h.approval is not None)
        if message is not None:
            raise ToolError(message)
        return Applied(record, new_header, changes, plan, output_json)

    @staticmethod
    def _known(state: TxState, view: StepView) -> dict[bytes, Touched | None]:
        out: dict[bytes, Touched | None] = {}
        for dk in {*view.states, *view.observed}:
            out[dk] = view.fetched[dk] if dk in view.fetched else state.entries.get(dk)
        return out

    async def _apply(self, attempt: Attempt, applied: Applied) -> StepOutcome:
        view, state, step_id = attempt.view, attempt.state, attempt.step_id
        record, plan = applied.record, applied.plan
        tx = state.header.id
        if view.fs is not None:
            failpoints.hit("fs.write.before_intent")
        try:
            res = await self.store.txn(plan.compares, plan.success, plan.failure, what="step")
        except StoreUnavailable:
            # The CAS may or may not have applied. An fs.write keeps its temp file: if the
            # step was recorded, that file is what tells the next call the rename never
            # happened (it rolls the step back). Once etcd answers again, a background
            # check removes the file if the step was not recorded after all.
            if view.fs is None:
                await view.discard()
            else:
                self._settle_later(state.header, state.rev, step_id, view.attempt,
                                   view.fs.tmp)
                view.fs = None
            self.txs.evict(tx)
            if is_custom_saga(attempt.tool):
                if await self._recorded(tx, step_id, record.attempt):
                    return StepOutcome(status="SUCCESS", next_step_id=step_id + 1,
                                       constraints=list(applied.header.constraints),
                                       output_json=applied.output_json)
                await self._compensate_unrecorded(attempt)
            raise StoreUnavailable(
                f"etcd unreachable while recording step {step_id} of transaction {tx}; its "
                "outcome is unknown: call GetTransaction") from None
        if not res.succeeded:
            await view.discard()
            await self._compensate_unrecorded(attempt)
            raise self.undoer.lost(state, plan, res, "step")
        if view.fs is not None:
            failpoints.hit("fs.write.after_intent")
            try:
                await asyncio.to_thread(sandbox.install_temp, view.fs.tmp, view.fs.target)
            except OSError as exc:
                log.error("fs.write rename failed after its intent was committed",
                          extra={"tx": tx, "step": step_id, "error": str(exc)})
                return await self._rename_failed(attempt, applied, res.revision, exc)
            failpoints.hit("fs.write.after_rename")
        self._remember(state, applied, res.revision)
        METRICS.child(METRICS.steps, _tool_label(self.tools, record.tool), "success").inc()
        note(status="SUCCESS", extra_reads=view.extra_reads)
        return StepOutcome(status="SUCCESS", next_step_id=step_id + 1,
                           constraints=list(applied.header.constraints),
                           output_json=applied.output_json)

    def _remember(self, state: TxState, applied: Applied, rev: int) -> None:
        """Carry the step that just applied into the cached state."""
        record, header, changes = applied.record, applied.header, applied.changes
        tx = header.id
        if self.txs.get(tx) is not state:
            return
        state.header, state.rev = header, rev
        state.entries.update(changes.entries)
        state.records[record.step_id] = record
        state.outputs[record.step_id] = record.output
        if changes.effects:
            state.effects[record.step_id] = tuple(changes.effects)
        state.fs_settled = True
        for resv in changes.reservations:
            self.data.remember(resv, KeyValue(resv, b"staged", rev, rev, 0))
        if changes.lock_new is not None:
            self.data.remember(changes.lock_new, KeyValue(changes.lock_new, tx.encode(), rev,
                                                          rev, 0))
        undo_image = len(record.fs.previous or b"") if record.fs is not None else 0
        self.txs.grow(tx, state, 256 * (len(changes.entries) + 1)
                      + 2 * len(applied.output_json) + undo_image)

    async def _rename_failed(self, attempt: Attempt, applied: Applied, rev: int,
                             exc: OSError) -> StepOutcome:
        """The intent is recorded but the file could not be put in place: undo the step
        record (the disk never changed), then report the failure like any other."""
        record, header = applied.record, applied.header
        state = TxState(header=header, rev=rev, entries=dict(attempt.state.entries),
                        complete=False)
        state.records[record.step_id] = record
        # the failure's history entry takes the place of the SUCCESS one the CAS wrote
        await self.undoer.run(state, [record], Target(record.step_id, False, False),
                              base=replace(header, fs_pending=None,
                                           history_seq=header.history_seq - 1))
        await attempt.view.discard()
        fresh = await self.loader.for_step(header.id, (), (), use_cache=False)
        path = record.fs.path if record.fs is not None else "?"
        rerun = replace(attempt, state=fresh,
                        request=replace(attempt.request, tool=None))
        return await self._failed(rerun, f"{exc.strerror or exc}: '{path}'", "path", None,
                                  rebuild_view=True)

    def _settle_later(self, header: TxHeader, rev: int, step_id: int, attempt: str,
                      tmp: pathlib.Path) -> None:
        """After an fs.write whose CAS outcome is unknown: once etcd answers, make that
        outcome final (`fence_unknown_step_plan`: the lost CAS can no longer apply), then
        drop the temp file unless the header marks exactly this write as pending (then
        the next call on the transaction rolls the step back and drops it). A plain read
        is not enough: etcd may serve it before it applies the lost CAS, and a temp file
        dropped under a step recorded afterwards would make the step look renamed, i.e.
        applied, with its file never written. Off the request path; if this replica
        dies first, the temp sweep decides the same way. A fence that times out is not
        retried blindly: run again, it either fences or reads what is there."""
        tx_id = header.id
        plan = fence_unknown_step_plan(self.keys, header, rev)

        async def settle() -> None:
            delay = 0.2
            while True:
                try:
                    res = await self.store.txn(plan.compares, plan.success, plan.failure,
                                               what="step settle")
                    break
                except StoreUnavailable:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            kv = None if res.succeeded else res.first(0)
            pending = decode_header(kv.value).fs_pending if kv is not None else None
            if pending is None or (pending.step_id, pending.attempt) != (step_id, attempt):
                await asyncio.to_thread(sandbox.discard_temp, tmp)
            self.txs.evict(tx_id)  # the fence moved the header on: reload next time

        task = asyncio.create_task(settle(), name=f"settle-write-{tx_id}-{step_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _recorded(self, tx_id: str, step_id: int, attempt: str) -> bool:
        """After an ambiguous CAS: is the step record there, and is it this attempt's?"""
        try:
            kv = await self.store.get(self.keys.step(tx_id, step_id), what="load")
        except StoreUnavailable:
            raise StoreUnavailable(
                f"etcd unreachable while recording step {step_id} of transaction {tx_id}; "
                "its outcome is unknown: call GetTransaction") from None
        return kv is not None and decode_step(kv.value).attempt == attempt

    async def _compensate_unrecorded(self, attempt: Attempt, *,
                                     intent_held: bool = False) -> None:
        """A custom saga already changed the world: if its step is not recorded, undo it
        now, or the step would have an effect without being live (docs/recovery.md). A
        toolset saga is undone here only while this replica still holds its intent and
        is about to clear it (`intent_held`, a failed step's CAS); otherwise whoever
        settles the intent undoes it, once."""
        tool = attempt.tool
        if attempt.result is None or not is_custom_saga(tool):
            return
        if has_intent(tool) and not intent_held:
            return
        assert tool is not None
        result, attempt.result = attempt.result, None
        try:
            await tool.compensate(result.compensation)
        except Exception as exc:  # logged loudly: the effect outlives its step
            log.error("could not compensate an unrecorded saga step",
                      extra={"tx": attempt.header.id, "step": attempt.step_id,
                             "tool": tool.name, "error": f"{type(exc).__name__}: {exc}"})

    # ---- toolset saga calls -------------------------------------------------------------

    async def _write_intent(self, state: TxState, step_id: int, attempt: str,
                            intent: dict[str, Any], timeout_s: float) -> None:
        """Before a toolset saga call: the header's `SagaPending` marker and the call
        itself (`tx/<id>/intent`) in ONE CAS. Its compare on the header validates the
        state the step runs on (a stale cache loses it, and nothing was called). The
        state object moves to the new revision, so the step's own CAS builds on it."""
        h = state.header
        now = time.time()
        # the call cannot outlive this: Upstream bounds it at twice its timeout + 5 s
        marker = SagaPending(step_id, attempt, self.replica_id, now, now + 2 * timeout_s + 10)
        new = replace(h, saga_pending=marker, updated_at=now)
        plan = intent_plan(self.keys, h, state.rev, new,
                           to_json({**intent, "step": step_id, "attempt": attempt}))
        res = await self.undoer.send(state, plan, "saga intent")
        state.header, state.rev = new, res.revision

    async def _outcome_unknown(self, attempt: Attempt, exc: OutcomeUnknown) -> StepOutcome:
        """A toolset saga call that may have acted (timed out, connection dropped): settle
        its intent now, as any replica would after a crash. Compensated from its
        arguments: the step failed like any other (retry first). Not compensable
        without its output: MANUAL, with the call named in compensation_errors."""
        await attempt.view.discard()
        state, step_id = attempt.state, attempt.step_id
        g = state.header.saga_pending
        if g is None or (g.step_id, g.attempt) != (step_id, attempt.view.attempt):
            return await self._failed(attempt, exc.message, exc.argument, exc.data,
                                      category=exc.category)
        hint = clean_error(exc.message, category=exc.category)
        state, errors = await self.undoer.settle_saga(state, hint=hint.hint, reported=True)
        attempt.state = state
        if not errors:
            return await self._failed(attempt, exc.message, exc.argument, exc.data,
                                      category=exc.category)
        h = state.header
        METRICS.child(METRICS.steps, _tool_label(self.tools, attempt.request.tool_name),
                      "rollback_triggered").inc()
        METRICS.rollbacks.labels(Strategy.MANUAL.value.lower()).inc()
        note(status="ROLLBACK_TRIGGERED", category=hint.category,
             strategy=Strategy.MANUAL.value, compensation_errors=errors)
        return StepOutcome(status="ROLLBACK_TRIGGERED", next_step_id=h.next_step_id,
                           constraints=list(h.constraints), clean_hint=hint.hint,
                           strategy=Strategy.MANUAL, rollback_to_step=h.next_step_id,
                           error_category=hint.category, compensation_errors=errors)

    # ---- a failed step -----------------------------------------------------------------

    async def _failed(self, attempt: Attempt, raw: str, argument: str | None,
                      data: str | None, *, rebuild_view: bool = False,
                      category: str | None = None) -> StepOutcome:
        view, state, step_id = attempt.view, attempt.state, attempt.step_id
        await view.discard()
        await self._compensate_unrecorded(attempt, intent_held=True)
        h = state.header
        cleaned = clean_error(raw, known_tools=attempt.request.known_tools(),
                              category=category)
        constraints = add_constraint(h.constraints, cleaned.hint)
        attempts = h.attempts + 1
        highest = max(h.highest_step, step_id)
        live = h.live
        observed = {} if rebuild_view else dict(view.observed)
        assumed = {} if rebuild_view else dict(view.assumed)
        known = self._known(state, view)
        touches = _touches(view, live, {*attempt.refs, *attempt.provenance.values()})
        deps = find_dependencies(referenced_steps=attempt.refs, touched=view.touched,
                                 live=touches)
        culprit = find_culprit(category=cleaned.category,
                               offending_ref_step=offending_step(argument, attempt.provenance),
                               offending_data=data, live=touches)
        policy = h.policy
        plan = plan_rollback(
            FailureFacts(failed_step=step_id, category=cleaned.category, culprit=culprit,
                         dependencies=deps, live_steps=tuple(live), attempts=attempts,
                         global_resets=h.global_resets, replay_used=h.replay_used,
                         highest_step=highest),
            PolicyLimits(policy.max_local_depth, policy.max_global_resets,
                         policy.replay_budget_factor))
        note(status="ROLLBACK_TRIGGERED", category=cleaned.category,
             strategy=plan.strategy.value, undo=list(plan.undo))
        outcome = StepOutcome(
            status="ROLLBACK_TRIGGERED", next_step_id=plan.next_step_id,
            constraints=list(constraints), clean_hint=cleaned.hint, strategy=plan.strategy,
            rollback_to_step=plan.rollback_to_step, context_reset=plan.context_reset,
            error_category=cleaned.category)
        observations = observation_entries(observed, known)
        base = replace(h, constraints=constraints, highest_step=highest, updated_at=time.time(),
                       fs_pending=None, saga_pending=None)
        request = attempt.request
        tool_label = _tool_label(self.tools, request.tool_name)
        entry = HistoryEntry.of(
            step_id, request.tool_name,
            "FAILED" if plan.strategy is Strategy.ABORT else "ROLLBACK_TRIGGERED",
            arguments_json=request.arguments_json, category=cleaned.category,
            hint=cleaned.hint, strategy=plan.strategy.value)
        if plan.strategy is Strategy.LOCAL_BACKTRACK:
            new = replace(base, attempts=attempts, budget=replace(
                h.budget, read_keys=h.budget.read_keys + len(observations)))
            put, new = await self.undoer.history.entry(new, entry)
            txn_plan = step_plan(self.keys, h, state.rev, new, None, "",
                                 StepChanges(observed=observed, entries=observations,
                                             assumed=assumed),
                                 history=[put])
            res = await self.undoer.send(state, txn_plan, "step")
            self._remember_failure(state, new, res.revision, observations)
            _count_failure(tool_label, outcome)
            return outcome
        started = time.perf_counter()
        records = await self.loader.records(state, list(plan.undo))
        result = await self.undoer.run(
            state, records,
            Target(plan.next_step_id, plan.strategy is Strategy.ABORT, True,
                   plan.global_resets, h.replay_used + len(plan.undo),
                   Ending(ABORTED, request.caller.principal, plan.abort_reason)),
            base=base, observed=assumed, observations=observations, failed=entry)
        outcome.rollback_latency_ms = (time.perf_counter() - started) * 1000.0
        if result.errors:
            assert result.header is not None
            outcome.strategy = Strategy.MANUAL
            outcome.next_step_id = result.header.next_step_id
            outcome.rollback_to_step = min(result.done) if result.done else \
                result.header.next_step_id
            outcome.compensation_errors = result.errors
            outcome.context_reset = False
            note(strategy=Strategy.MANUAL.value, compensation_errors=result.errors)
        elif plan.strategy is Strategy.ABORT:
            outcome.status, outcome.abort_reason = "FAILED", plan.abort_reason
            METRICS.transactions_ended.labels("failed").inc()
        _count_failure(tool_label, outcome)
        return outcome

    def _remember_failure(self, state: TxState, header: TxHeader, rev: int,
                          observations: Mapping[bytes, Touched]) -> None:
        if self.txs.get(header.id) is not state:
            return
        state.header, state.rev = header, rev
        state.entries.update(observations)
        state.fs_settled = True


def _count_failure(tool_label: str, outcome: StepOutcome) -> None:
    METRICS.steps.labels(tool_label, "failed" if outcome.status == "FAILED"
                         else "rollback_triggered").inc()
    METRICS.rollbacks.labels(outcome.strategy.value.lower()).inc()
    METRICS.rollback_duration.labels(outcome.strategy.value.lower()).observe(
        outcome.rollback_latency_ms / 1000.0)


def _gated(header: TxHeader, step_id: int, tool: str, arguments: Any,
           effects: Sequence[StagedEffect]) -> tuple[GatedCall, ...]:
    """What this step will do that needs approval under the transaction's policy
    (docs/approvals.md), recorded with the step: each effect it staged on a listed
    channel (or staged while its tool matches a glob), with its payload; else, when its
    tool matches a glob, its call with the resolved arguments (a deferred toolset call
    included: the call it staged on its toolset's pseudo-channel is exactly that)."""
    approval = header.approval
    if approval is None:
        return ()
    tool_gated = approval.gates_tool(tool)
    staged = [e for e in effects if not e.channel.startswith(DEFERRED_CHANNEL)]
    out = [GatedCall(step_id, tool, e.channel, e.payload) for e in staged
           if tool_gated or approval.gates_channel(e.channel)]
    if tool_gated and not staged:
        out.append(GatedCall(step_id, tool, "", arguments))
    return tuple(out)


def _tool_label(tools: ToolRegistry, name: str) -> str:
    """A bounded metric label: registered tool names only."""
    return name if tools.get(name) is not None else "unknown"


def _touches(view: StepView, live: range, referenced: set[int]) -> list[StepTouch]:
    """The live steps the failed step relates to — those it references, and the last
    writer (or deleter) of each data id it touched — with what they did to those ids:
    the facts find_dependencies / find_culprit need, and nothing more."""
    by_step: dict[int, tuple[set[str], set[str]]] = {s: (set(), set()) for s in referenced
                                                     if s in live}
    for data_id, state in view.entries_of_touched():
        if state.writer not in live:
            continue
        writes, deletes = by_step.setdefault(state.writer, (set(), set()))
        if state.writer_op in ("put", "both"):
            writes.add(data_id)
        if state.writer_op in ("delete", "both"):
            deletes.add(data_id)
    return [StepTouch(s, frozenset(w), frozenset(d)) for s, (w, d) in sorted(by_step.items())]


def _delta(view: StepView, known: Mapping[bytes, Touched | None],
           entries: Mapping[bytes, Touched], tool: str, raw_context: str) -> Budget:
    reads = sum(1 for dk in entries if is_data_key(dk) and known.get(dk) is None)
    write_keys = 0
    write_bytes = 0
    for dk, state in view.states.items():
        if not is_data_key(dk):
            continue
        _, before = view.before[dk]
        old, new = before.write, state.write
        write_keys += (new is not None) - (old is not None)
        write_bytes += (new.size if new else 0) - (old.size if old else 0)
    return Budget(read_keys=reads, write_keys=write_keys, write_bytes=write_bytes,
                  effects=len(view.effects), effect_bytes=view.effect_bytes,
                  locks=1 if view.lock_new is not None else 0,
                  context_bytes=context_cost(tool, raw_context))

