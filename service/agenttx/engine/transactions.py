"""The transaction state machine: begin, step, commit, rollback, get.

All state lives in etcd (store.layout); replicas are stateless and any of them can serve
any call. Every state change is ONE etcd transaction guarded by compare-and-swap on the
transaction header's mod_revision, so two replicas racing on the same step produce
exactly one winner; the loser re-reads and answers FAILED_PRECONDITION.

etcd round trips per RPC (the budget, see docs/architecture.md):
- BeginTransaction: 1 (create the header iff absent).
- ExecuteStep, success: 2 — one read of header + live steps + every data key named
  literally in the arguments, one CAS write. +1 read only when a `${steps…}` reference
  names a data key that was not prefetched. A failure costs the same plus, when fs
  steps must be undone, one intent write before touching the disk (crash safety).
- CommitTransaction: 2 — one read, one CAS that applies the write set, fills the outbox
  and ends the transaction. +1 write per effect delivered during the call (retiring its
  outbox entry).
- RollbackTransaction: 2 (read + CAS), +1 intent write when fs steps are undone.
- GetTransaction: 1 read (+1 blind write recording activity for the idle reaper).

Nothing here imports grpc: errors are agenttx.errors, results are engine.model types.
"""

from __future__ import annotations

import base64
import binascii
import logging
import pathlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import failpoints
from ..cleaner import clean_error
from ..errors import Conflict, FailedPrecondition, InvalidArgument, NotFound, StoreUnavailable
from ..store.client import (
    KeyValue,
    Store,
    cmp_absent,
    cmp_mod,
    cmp_value,
    op_delete,
    op_delete_prefix,
    op_get,
    op_put,
    prefix_end,
)
from ..store.layout import COMMIT_RESERVED_OPS, Keys
from ..tools.base import RollbackKind, ToolError, validate_arguments
from ..tools.registry import ToolRegistry
from . import sandbox
from .context import Overlay, StepContext, fs_data_id, lock_path
from .jsonargs import ArgumentsError, dumps, parse_arguments
from .model import (
    ACTIVE,
    AWAITING_ROLLBACK,
    CommitOutcome,
    ContextItem,
    RollbackOutcome,
    StepOutcome,
    TransactionView,
    from_json,
    to_json,
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
from .policy import EffectivePolicy
from .refs import ReferenceError_, resolve

log = logging.getLogger(__name__)

# Size budgets, as fractions of etcd's --max-request-bytes (settings.etcd_max_request_bytes;
# the embedded etcd and the chart's etcd run with 16 MiB, etcd's own default is 1.5 MiB):
# a step record (output, raw_context, buffered writes, undo image) must fit one request,
# and so must the commit, which carries the whole write set and the outbox entries plus
# keys and compares. A step that would break either fails with program_limit_exceeded,
# so etcd never refuses a write the service promised to make.
STEP_BYTES_SHARE = 0.6
COMMIT_BYTES_SHARE = 0.75
# How long an fs.write may sit between its CAS and its rename before another replica
# may treat it as interrupted (its owner is also checked for liveness).
APPLY_GRACE_S = 30.0
# ListTransactions: keys read per scan of the transaction subtree (keys only, so a few
# tens of KiB), and headers read per etcd transaction (below etcd's upstream default of
# 128 operations per Txn, embed.DefaultMaxTxnOps, so an external etcd accepts it too).
LIST_SCAN_KEYS = 512
LIST_HEADER_BATCH = 64
OPEN_STATUSES = (ACTIVE, AWAITING_ROLLBACK)


@dataclass(frozen=True)
class TransactionSummary:
    """One row of ListTransactions (read from the transaction header only)."""

    transaction_id: str
    status: str
    agent_id: str
    principal: str
    next_step_id: int
    created_at: float
    updated_at: float


@dataclass
class Snapshot:
    """A transaction as read in one round trip."""

    tx_id: str
    header: dict[str, Any]
    header_rev: int
    steps: dict[int, dict[str, Any]]            # live steps by id
    data: dict[bytes, KeyValue | None]
    covered: tuple[bytes, ...] = ()

    @property
    def live(self) -> list[int]:
        return sorted(self.steps)

    def ordered(self) -> list[dict[str, Any]]:
        return [self.steps[i] for i in self.live]


def _now() -> float:
    return time.time()


class Engine:
    def __init__(
        self,
        *,
        store: Store,
        keys: Keys,
        tools: ToolRegistry,
        resolve_policy: Callable[[str, Mapping[str, str], dict[str, Any]], EffectivePolicy],
        default_fs_root: str,
        replica_id: str,
        channel_names: Callable[[], list[str]],
        max_txn_ops: int = 1024,
        max_request_bytes: int = 16 * 1024 * 1024,
        dispatcher: Any = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.tools = tools
        self._resolve_policy = resolve_policy
        self.default_fs_root = default_fs_root
        self.replica_id = replica_id
        self.channel_names = channel_names
        self.max_write_ops = max_txn_ops - COMMIT_RESERVED_OPS
        self.max_step_bytes = int(max_request_bytes * STEP_BYTES_SHARE)
        self.max_commit_bytes = int(max_request_bytes * COMMIT_BYTES_SHARE)
        self.dispatcher = dispatcher

    # ------------------------------------------------------------------ begin
    async def begin(self, agent_id: str, metadata: Mapping[str, str],
                    overrides: dict[str, Any]) -> tuple[str, int]:
        try:
            policy = self._resolve_policy(agent_id, metadata, overrides)
        except ValueError as exc:
            raise InvalidArgument(f"policy: {exc}") from None
        fs_root = policy.sandbox_path or self.default_fs_root
        tx_id = str(uuid.uuid4())
        now = _now()
        header = {
            "id": tx_id,
            "agent_id": agent_id,
            "metadata": dict(metadata),
            "status": ACTIVE,
            "policy": {
                "max_local_depth": policy.rollback.max_local_depth,
                "max_global_resets": policy.rollback.max_global_resets,
                "replay_budget_factor": policy.rollback.replay_budget_factor,
                "idle_timeout_s": policy.idle_timeout_s,
                "fs_root": fs_root,
                "source": policy.source,
            },
            "next_step_id": 1,
            "attempts": 0,
            "highest_step": 0,
            "replay_used": 0,
            "global_resets": 0,
            "constraints": [],
            "created_at": now,
            "updated_at": now,
            "pending_undo": [],
        }
        key = self.keys.tx_header(tx_id)
        res = await self.store.txn([cmp_absent(key)], [op_put(key, to_json(header))],
                                   what="begin")  # 1 round trip
        if not res.succeeded:  # a UUID collision: never in practice, but never silently
            raise FailedPrecondition(f"transaction id {tx_id} already exists; retry")
        log.info("transaction begun", extra={"tx": tx_id, "agent_id": agent_id,
                                             "policy": policy.source})
        return tx_id, 1

    # ------------------------------------------------------------------ load
    async def _load(self, tx_id: str, extra: Sequence[bytes] = (),
                    extra_prefixes: Sequence[bytes] = ()) -> Snapshot:
        header_key = self.keys.tx_header(tx_id)
        steps_prefix = self.keys.steps_prefix(tx_id)
        res = await self.store.read([header_key, *extra], [steps_prefix, *extra_prefixes],
                                    what="load")
        hk = res.single[header_key]
        if hk is None:
            raise NotFound(f"transaction {tx_id} not found (unknown, committed or aborted)")
        steps = {}
        for kv in res.ranges[steps_prefix]:
            rec = from_json(kv.value)
            steps[int(rec["step_id"])] = rec
        data = {k: v for k, v in res.single.items() if k != header_key}
        for p in extra_prefixes:
            for kv in res.ranges[p]:
                data[kv.key] = kv
        return Snapshot(tx_id, from_json(hk.value), hk.mod_revision, steps, data,
                        tuple(extra_prefixes))

    def _require_active(self, snap: Snapshot) -> None:
        if snap.header["status"] == AWAITING_ROLLBACK:
            raise FailedPrecondition(
                f"transaction {snap.tx_id} is waiting for a manual rollback: an undo action "
                "failed; call RollbackTransaction")
        if snap.header["status"] != ACTIVE:
            raise FailedPrecondition(f"transaction {snap.tx_id} is {snap.header['status']}")

    # ------------------------------------------------------------------ execute
    async def execute(self, tx_id: str, step_id: int, tool_name: str, arguments_json: str,
                      raw_context: str) -> StepOutcome:
        tool = self.tools.get(tool_name)
        parsed: dict[str, Any] | None = None
        parse_error: ArgumentsError | None = None
        try:
            parsed = parse_arguments(arguments_json)
        except ArgumentsError as exc:
            parse_error = exc
        prefetch: list[bytes] = []
        if tool is not None and parsed is not None:
            try:
                prefetch, prefixes = self._prefetch_keys(tool.prefetch(parsed))
            except Exception:  # prefetch is an optimisation; a bad shape fails later
                prefetch, prefixes = [], []
        else:
            prefixes = []
        snap = await self._load(tx_id, prefetch, prefixes)             # round trip 1
        snap = await self._settle(snap)
        self._require_active(snap)
        header = snap.header
        if step_id != header["next_step_id"]:
            raise FailedPrecondition(
                f"step_id {step_id} is out of order: transaction {tx_id} expects step "
                f"{header['next_step_id']}")

        overlay = Overlay.build(snap.ordered())
        fs_root = header["policy"]["fs_root"]
        pathlib.Path(fs_root).mkdir(parents=True, exist_ok=True)
        ctx = StepContext(store=self.store, keys=self.keys, tx_id=tx_id, step_id=step_id,
                          fs_root=fs_root, overlay=overlay, prefetched=dict(snap.data),
                          channel_names=self.channel_names, covered=snap.covered)
        refs: set[int] = set()
        provenance: dict[str, int] = {}
        result = None
        try:
            if parse_error is not None:
                raise ToolError(parse_error.args[0])
            if tool is None:
                raise ToolError(f"function {tool_name}() does not exist")
            outputs = {i: rec["output"] for i, rec in snap.steps.items()}
            try:
                resolution = resolve(parsed, outputs)
            except ReferenceError_ as exc:
                if exc.step is not None and exc.step in snap.steps:
                    refs.add(exc.step)
                raise ToolError(exc.message, argument=exc.argument) from None
            refs, provenance = resolution.referenced, resolution.provenance
            args = validate_arguments(resolution.value, tool.fields)
            result = await tool.execute(args, ctx)
            output = result.output
            output_json = dumps(output)
            self._check_limits(ctx, overlay, output_json, raw_context)
        except ToolError as exc:
            ctx_cleanup(ctx)
            await self._compensate_unrecorded(tool, result, tx_id, step_id)
            return await self._fail(snap, step_id, tool_name, exc.message, exc.argument,
                                    exc.data, refs, provenance, ctx.touched)
        except Exception as exc:  # a custom tool's own failure: its text is the message
            ctx_cleanup(ctx)
            await self._compensate_unrecorded(tool, result, tx_id, step_id)
            log.info("tool raised", extra={"tx": tx_id, "tool": tool_name,
                                           "error": f"{type(exc).__name__}: {exc}"})
            return await self._fail(snap, step_id, tool_name, str(exc) or type(exc).__name__,
                                    None, None, refs, provenance, ctx.touched)

        record = ctx.record(tool=tool_name, output=output, raw_context=raw_context, refs=refs)
        if not _is_custom_saga(tool):
            return await self._apply_success(snap, step_id, ctx, record, output_json)
        # A custom saga already changed the world: if its step is not recorded, undo it
        # now, or the step would have an effect without being live (SPEC §2).
        record["saga"] = {"compensation": result.compensation}
        record["attempt"] = uuid.uuid4().hex
        try:
            outcome = await self._apply_success(snap, step_id, ctx, record, output_json)
        except StoreUnavailable:
            if await self._step_recorded(tx_id, step_id, record["attempt"]):
                return StepOutcome(status="SUCCESS", next_step_id=step_id + 1,
                                   constraints=list(snap.header["constraints"]),
                                   output_json=output_json)
            await self._compensate_unrecorded(tool, result, tx_id, step_id)
            raise
        except BaseException:
            await self._compensate_unrecorded(tool, result, tx_id, step_id)
            raise
        if outcome.status != "SUCCESS":
            await self._compensate_unrecorded(tool, result, tx_id, step_id)
        return outcome

    async def _step_recorded(self, tx_id: str, step_id: int, attempt: str) -> bool:
        """After an ambiguous CAS: is the step record there, and is it this attempt's?"""
        try:
            kv = await self.store.get(self.keys.step(tx_id, step_id))
        except StoreUnavailable:
            raise StoreUnavailable(
                f"etcd unreachable while recording step {step_id} of transaction {tx_id}; "
                "its outcome is unknown: call GetTransaction") from None
        return kv is not None and from_json(kv.value).get("attempt") == attempt

    async def _compensate_unrecorded(self, tool: Any, result: Any, tx_id: str,
                                     step_id: int) -> None:
        if result is None or not _is_custom_saga(tool):
            return
        try:
            await tool.compensate(result.compensation)
        except Exception as exc:  # logged loudly: the effect outlives its step
            log.error("could not compensate an unrecorded saga step",
                      extra={"tx": tx_id, "step": step_id, "tool": tool.name,
                             "error": f"{type(exc).__name__}: {exc}"})

    def _prefetch_keys(self, wanted: Any) -> tuple[list[bytes], list[bytes]]:
        keys: list[bytes] = []
        prefixes: list[bytes] = []
        for kind, value in wanted:
            if kind == "kv":
                keys.append(self.keys.kv(value))
            elif kind == "rec":
                table, rid = value
                keys.append(self.keys.record(table, rid))
            elif kind == "fs":
                prefixes.append(self.keys.fs_lock_prefix(lock_path(value)))
        return keys, prefixes

    def _check_limits(self, ctx: StepContext, overlay: Overlay, output_json: str,
                      raw_context: str) -> None:
        write_keys = overlay.write_keys(self.keys) | {self.keys.kv(k).decode() for k in ctx.kv} \
            | set(ctx.rec)
        locks = set(overlay.locks) | ({ctx.fs["lock"]} if ctx.fs else set())
        ops = len(write_keys) + overlay.effects + len(ctx.effects) + len(locks)
        if ops > self.max_write_ops:
            raise ToolError(
                f"program limit exceeded: the transaction would write {ops} keys, effects and "
                f"locks; the limit is {self.max_write_ops} (etcd --max-txn-ops minus "
                f"{COMMIT_RESERVED_OPS} reserved)")
        write_bytes = len(dumps(ctx.kv)) + len(dumps(ctx.rec)) + len(dumps(ctx.effects))
        size = len(output_json) + len(raw_context.encode()) + write_bytes + \
            len((ctx.fs or {}).get("previous") or "")
        if size > self.max_step_bytes:
            raise ToolError(
                f"program limit exceeded: the step would store {size} bytes; the limit is "
                f"{self.max_step_bytes} (a share of etcd's --max-request-bytes)")
        total = overlay.write_bytes + write_bytes
        if total > self.max_commit_bytes:
            raise ToolError(
                f"program limit exceeded: the transaction's writes would reach {total} bytes; "
                f"one commit carries at most {self.max_commit_bytes}")
        ctx.write_bytes = write_bytes

    async def _apply_success(self, snap: Snapshot, step_id: int, ctx: StepContext,
                             record: dict[str, Any], output_json: str) -> StepOutcome:
        header = dict(snap.header)
        header.update(next_step_id=step_id + 1, attempts=0,
                      highest_step=max(header["highest_step"], step_id), updated_at=_now())
        hkey = self.keys.tx_header(snap.tx_id)
        compares = [cmp_mod(hkey, snap.header_rev)]
        success = [op_put(hkey, to_json(header)),
                   op_put(self.keys.step(snap.tx_id, step_id), to_json(record))]
        prev = snap.steps.get(step_id - 1)
        if prev and prev.get("fs") and prev["fs"].get("state") == "done":
            # settled by _settle_applying; record it so no later call re-checks the disk
            success.append(op_put(self.keys.step(snap.tx_id, step_id - 1), to_json(prev)))
        fs = ctx.fs
        if fs:
            fs["owner"] = self.replica_id
            fs["since"] = _now()
            lock = fs["lock"].encode()
            if fs["lock_new"]:
                compares.append(cmp_absent(lock))
                success.append(op_put(lock, snap.tx_id.encode()))
            else:
                compares.append(cmp_value(lock, snap.tx_id.encode()))
            success[1] = op_put(self.keys.step(snap.tx_id, step_id), to_json(record))
        if fs:
            failpoints.hit("fs.write.before_intent")
        res = await self.store.txn(compares, success, [op_get(hkey)], what="step")  # round trip 2
        if not res.succeeded:
            if fs:
                sandbox.discard_temp(pathlib.Path(fs["tmp"]))
            current = res.responses[0].response_range.kvs if res.responses else []
            if not current:
                raise NotFound(f"transaction {snap.tx_id} not found (unknown, committed or aborted)")
            if int(current[0].mod_revision) != snap.header_rev:
                now_next = from_json(bytes(current[0].value))["next_step_id"]
                raise FailedPrecondition(
                    f"step {step_id} lost a race: transaction {snap.tx_id} was changed "
                    f"concurrently and now expects step {now_next}")
            # Header unchanged: the path lock was taken by another transaction meanwhile.
            return await self._fail(snap, step_id, record["tool"],
                                    'could not obtain lock on row in relation "fs"', "path",
                                    fs_data_id(fs["path"]) if fs else None, set(record["refs"]),
                                    {}, set(record["touched"]))
        if fs:
            failpoints.hit("fs.write.after_intent")
            try:
                sandbox.install_temp(pathlib.Path(fs["tmp"]), pathlib.Path(fs["target"]))
            except OSError as exc:
                log.error("fs.write rename failed after commit of intent",
                          extra={"tx": snap.tx_id, "step": step_id, "error": str(exc)})
                # Undo the step record, then report the failure like any other. The temp
                # file stays until the revert is durable: while it exists, any replica
                # sees this write as not landed.
                restored = await self._revert_step(snap, step_id, res.revision, fs)
                sandbox.discard_temp(pathlib.Path(fs["tmp"]))
                return await self._fail(restored, step_id, record["tool"],
                                        f"{exc.strerror or exc}: '{fs['path']}'", "path",
                                        None, set(record["refs"]), {}, set(record["touched"]))
        if fs:
            failpoints.hit("fs.write.after_rename")
        log.info("step applied", extra={"tx": snap.tx_id, "step": step_id,
                                        "tool": record["tool"], "extra_reads": ctx.extra_reads})
        return StepOutcome(status="SUCCESS", next_step_id=step_id + 1,
                           constraints=list(header["constraints"]), output_json=output_json)

    async def _revert_step(self, snap: Snapshot, step_id: int, rev: int,
                           fs: dict[str, Any]) -> Snapshot:
        hkey = self.keys.tx_header(snap.tx_id)
        ops = [op_put(hkey, to_json(snap.header)), op_delete(self.keys.step(snap.tx_id, step_id))]
        if fs.get("lock_new"):
            ops.append(op_delete(fs["lock"].encode()))
        res = await self.store.txn([cmp_mod(hkey, rev)], ops, what="revert step")
        if not res.succeeded:
            raise FailedPrecondition(f"transaction {snap.tx_id} changed concurrently")
        return await self._load(snap.tx_id)

    async def _settle(self, snap: Snapshot) -> Snapshot:
        """Finish what a dead replica left half-done (a rollback, a file write) before
        serving a call; both are rare and cost nothing when absent."""
        snap = await self._settle_undoing(snap)
        return await self._settle_applying(snap)

    async def _settle_applying(self, snap: Snapshot) -> Snapshot:
        """Decide the fate of an fs.write whose rename may not have happened.

        A step record in state "applying" was committed before its temp file was renamed
        over the target. Only the highest live step can still be in that window: a
        later step is applied only after this check, and its CAS marks earlier records
        done. The rename is what makes the write happen, so the write finished when its
        temp file is gone (or the file holds the new bytes). Otherwise, once the owner
        replica is gone (its leased liveness key expired) or the grace period passed,
        the write was interrupted: restore the previous bytes and drop the step, as if
        it never ran (SPEC §3)."""
        if not snap.steps:
            return snap
        for rec in snap.ordered()[:-1]:
            if rec.get("fs") and rec["fs"].get("state") == "applying":
                rec["fs"]["state"] = "done"  # persisted by the next state change
        last = snap.steps[snap.live[-1]]
        fs = last.get("fs")
        if not fs or fs.get("state") != "applying" or self._write_landed(fs):
            if fs:
                fs["state"] = "done"
            return snap
        if await self._owner_alive(fs) and _now() - fs.get("since", 0) < APPLY_GRACE_S:
            raise FailedPrecondition(
                f"step {last['step_id']} of transaction {snap.tx_id} is still being applied; "
                "retry shortly")
        return await self.recover_interrupted(snap, last["step_id"])

    @staticmethod
    def _write_landed(fs: dict[str, Any]) -> bool:
        if not pathlib.Path(fs["tmp"]).exists():
            return True
        return sandbox.current_hash(pathlib.Path(fs["target"])) == fs["new_sha256"]

    async def recover_interrupted(self, snap: Snapshot, step_id: int) -> Snapshot:
        """Roll back an interrupted fs.write step (always the last live step)."""
        then = {"next_step_id": step_id, "attempts": 0}
        errors, done, _ = await self._undo_and_finish(snap, [step_id], then, end=False)
        log.warning("recovered an interrupted fs.write", extra={"tx": snap.tx_id, "undone": done,
                                                                 "errors": errors})
        return await self._load(snap.tx_id)

    # ------------------------------------------------------------------ undo
    async def _undo_steps(self, snap: Snapshot, order: list[int]) -> tuple[list[str], list[int]]:
        """Run undo actions in `order`; stop at the first failure (SPEC §5 MANUAL).
        Returns (compensation errors, steps undone). Every undo action is idempotent."""
        errors: list[str] = []
        done: list[int] = []
        for sid in order:
            rec = snap.steps[sid]
            try:
                await self._undo_one(rec)
            except Exception as exc:
                errors.append(f"step {sid} ({rec['tool']}): {_describe_os_error(exc, rec)}")
                break
            done.append(sid)
        return errors, done

    async def _undo_one(self, rec: dict[str, Any]) -> None:
        fs = rec.get("fs")
        if fs:
            sandbox.discard_temp(pathlib.Path(fs["tmp"]))
            previous = base64.b64decode(fs["previous"]) if fs["existed"] else None
            sandbox.restore(pathlib.Path(fs["target"]), previous)
        saga = rec.get("saga")
        if saga is not None:
            tool = self.tools.get(rec["tool"])
            if tool is None:
                raise RuntimeError(f"tool {rec['tool']} is no longer installed")
            await tool.compensate(saga["compensation"])
        # journal (kv/record) and effects: dropping the step record is the undo.

    async def _write_state(self, snap: Snapshot, header: dict[str, Any], undone: list[int],
                           *, end: bool = False, fence: Sequence[Any] = ()) -> int:
        """One CAS: new header (or the end of the transaction), undone step records
        deleted, locks no longer held released."""
        hkey = self.keys.tx_header(snap.tx_id)
        ops: list[Any] = []
        remaining = [snap.steps[i] for i in snap.live if i not in undone]
        held = {r["fs"]["lock"] for r in remaining if r.get("fs")}
        for sid in undone:
            ops.append(op_delete(self.keys.step(snap.tx_id, sid)))
        compares = [cmp_mod(hkey, snap.header_rev), *fence]
        if end:
            ops = [op_delete_prefix(self.keys.tx_prefix(snap.tx_id))]
            held = set()
        for r in snap.ordered():
            fs = r.get("fs")
            if fs and fs["lock"] not in held:
                lock = fs["lock"].encode()
                ops.append(op_delete(lock))
                compares.append(cmp_value(lock, snap.tx_id.encode()))
                held.add(fs["lock"])  # delete each lock once
        if not end:
            ops.insert(0, op_put(hkey, to_json(header)))
        res = await self.store.txn(compares, _dedupe_ops(ops), [op_get(hkey)], what="state")
        if not res.succeeded:
            raise FailedPrecondition(
                f"transaction {snap.tx_id} was changed concurrently; re-read it with "
                "GetTransaction")
        return res.revision

    async def _undo_and_finish(self, snap: Snapshot, order: list[int], then: dict[str, Any],
                               *, end: bool, fence: Callable[[], Sequence[Any]] = lambda: (),
                               automatic: bool = False
                               ) -> tuple[list[str], list[int], dict[str, Any]]:
        """Undo `order` (descending step ids) and commit the resulting state.

        When files (or custom sagas) must be undone, an intent naming the steps and the
        state to reach (`then`, or the end of the transaction) is committed first, so a
        replica that dies half-way leaves a durable plan that any replica resumes
        (`_settle_undoing`). Undo actions are idempotent, so resuming is safe. If an undo
        fails, the rollback stops there and the transaction waits for a manual rollback
        (SPEC §5 MANUAL). Returns (errors, undone steps, the header written)."""
        work = snap
        if any(snap.steps[i].get("fs") or snap.steps[i].get("saga") for i in order):
            header = dict(snap.header)
            header["undoing"] = {"steps": order, "owner": self.replica_id, "since": _now(),
                                 "then": then, "end": end}
            hkey = self.keys.tx_header(snap.tx_id)
            res = await self.store.txn([cmp_mod(hkey, snap.header_rev), *fence()],
                                       [op_put(hkey, to_json(header))], what="undo intent")
            if not res.succeeded:
                raise FailedPrecondition(f"transaction {snap.tx_id} was changed concurrently; "
                                         "re-read it with GetTransaction")
            work = Snapshot(snap.tx_id, header, res.revision, snap.steps, snap.data)
            failpoints.hit("undo.after_intent")
        errors, done = await self._undo_steps(work, order)
        failpoints.hit("undo.after_restore")
        header = dict(work.header)
        header.pop("undoing", None)
        header["updated_at"] = _now()
        if errors:
            remaining = [i for i in snap.live if i not in done]
            header.update(status=AWAITING_ROLLBACK, attempts=0,
                          next_step_id=(max(remaining) + 1) if remaining else 1)
            if automatic:  # only automatic rollbacks count as replay (SPEC §5.3)
                header["replay_used"] = header.get("replay_used", 0) + len(done)
            await self._write_state(work, header, done, fence=fence())
            log.warning("undo failed; transaction awaits manual rollback",
                        extra={"tx": snap.tx_id, "errors": errors, "undone": done})
            return errors, done, header
        header.update(then)
        await self._write_state(work, header, done, end=end, fence=fence())
        return errors, done, header

    async def _settle_undoing(self, snap: Snapshot) -> Snapshot:
        """Resume a rollback whose replica died between its intent and its end."""
        intent = snap.header.get("undoing")
        if not intent:
            return snap
        if await self._owner_alive(intent) and _now() - intent.get("since", 0) < APPLY_GRACE_S:
            raise FailedPrecondition(f"a rollback of transaction {snap.tx_id} is in progress; "
                                     "retry shortly")
        order = [i for i in intent["steps"] if i in snap.steps]
        log.warning("resuming an interrupted rollback", extra={"tx": snap.tx_id, "steps": order,
                                                               "owner": intent.get("owner")})
        header = dict(snap.header)
        header.pop("undoing", None)
        base = Snapshot(snap.tx_id, header, snap.header_rev, snap.steps, snap.data)
        # Re-marking makes this replica the owner of the intent while it finishes it.
        errors, _, _ = await self._undo_and_finish(base, order, intent.get("then", {}),
                                                   end=bool(intent.get("end")))
        if intent.get("end") and not errors:
            raise NotFound(f"transaction {snap.tx_id} not found (unknown, committed or aborted)")
        return await self._load(snap.tx_id)

    async def _owner_alive(self, marker: dict[str, Any]) -> bool:
        owner = marker.get("owner", "")
        if owner == self.replica_id:
            return True
        return await self.store.get(self.keys.replica(owner)) is not None

    # ------------------------------------------------------------------ failure
    async def _fail(self, snap: Snapshot, step_id: int, tool_name: str, raw: str,
                    argument: str | None, data: str | None, refs: set[int],
                    provenance: dict[str, int], touched: set[str]) -> StepOutcome:
        cleaned = clean_error(raw, known_tools=self.tools.names())
        header = dict(snap.header)
        constraints = list(header["constraints"])
        if cleaned.hint not in constraints:
            constraints.append(cleaned.hint)
        header["constraints"] = constraints
        attempts = header["attempts"] + 1
        highest = max(header["highest_step"], step_id)
        live_touch = [StepTouch(r["step_id"], frozenset(r.get("writes", [])),
                                frozenset(r.get("deletes", []))) for r in snap.ordered()]
        deps = find_dependencies(referenced_steps=refs, touched=touched, live=live_touch)
        offending_ref = _offending_ref(argument, provenance)
        culprit = find_culprit(category=cleaned.category, offending_ref_step=offending_ref,
                               offending_data=data, live=live_touch)
        policy = header["policy"]
        plan = plan_rollback(
            FailureFacts(failed_step=step_id, category=cleaned.category, culprit=culprit,
                         dependencies=deps, live_steps=tuple(snap.live), attempts=attempts,
                         global_resets=header["global_resets"],
                         replay_used=header["replay_used"], highest_step=highest),
            PolicyLimits(policy["max_local_depth"], policy["max_global_resets"],
                         policy["replay_budget_factor"]))
        log.info("step failed", extra={"tx": snap.tx_id, "step": step_id, "tool": tool_name,
                                       "category": cleaned.category,
                                       "strategy": plan.strategy.value, "undo": plan.undo})
        header["highest_step"] = highest
        started = time.perf_counter()
        outcome = StepOutcome(
            status="ROLLBACK_TRIGGERED", next_step_id=plan.next_step_id, constraints=constraints,
            clean_hint=cleaned.hint, strategy=plan.strategy, rollback_to_step=plan.rollback_to_step,
            context_reset=plan.context_reset, error_category=cleaned.category)
        if plan.strategy is Strategy.LOCAL_BACKTRACK:
            header["attempts"] = attempts
            header["updated_at"] = _now()
            await self._write_state(snap, header, [])
            return outcome
        then = {"next_step_id": plan.next_step_id, "attempts": 0,
                "global_resets": plan.global_resets,
                "replay_used": header["replay_used"] + len(plan.undo)}
        undo_base = Snapshot(snap.tx_id, header, snap.header_rev, snap.steps, snap.data)
        errors, done, written = await self._undo_and_finish(
            undo_base, list(plan.undo), then, end=plan.strategy is Strategy.ABORT, automatic=True)
        outcome.rollback_latency_ms = (time.perf_counter() - started) * 1000.0
        if errors:
            outcome.strategy = Strategy.MANUAL
            outcome.next_step_id = written["next_step_id"]
            outcome.rollback_to_step = min(done) if done else written["next_step_id"]
            outcome.compensation_errors = errors
            outcome.context_reset = False
            return outcome
        if plan.strategy is Strategy.ABORT:
            outcome.status, outcome.abort_reason = "FAILED", plan.abort_reason
        return outcome

    # ------------------------------------------------------------------ rollback
    async def rollback(self, tx_id: str, to_step: int | None, reason: str) -> RollbackOutcome:
        snap = await self._load(tx_id)                                 # round trip 1
        snap = await self._settle(snap)
        header = dict(snap.header)
        if to_step and to_step >= header["next_step_id"]:
            raise InvalidArgument(
                f"to_step {to_step} is out of range: it must be lower than next_step_id "
                f"{header['next_step_id']} (or 0 to abort)")
        abort = not to_step
        order = [i for i in reversed(snap.live) if abort or i >= (to_step or 0)]
        then = {"status": ACTIVE, "next_step_id": to_step or 0, "attempts": 0}
        errors, done, written = await self._undo_and_finish(snap, order, then, end=abort)
        log.info("rollback requested", extra={"tx": tx_id, "to_step": to_step, "reason": reason,
                                              "undone": done, "errors": errors})
        if errors:
            return RollbackOutcome(False, written["next_step_id"], len(done), errors)
        return RollbackOutcome(True, 0 if abort else int(to_step or 0), len(done), [])

    # ------------------------------------------------------------------ commit
    async def commit(self, tx_id: str) -> CommitOutcome:
        snap = await self._load(tx_id)                                 # round trip 1
        snap = await self._settle(snap)
        self._require_active(snap)
        overlay = Overlay.build(snap.ordered())
        hkey = self.keys.tx_header(tx_id)
        compares = [cmp_mod(hkey, snap.header_rev)]
        success: list[Any] = []
        written: list[bytes] = []
        for key, w in overlay.kv.items():
            ekey = self.keys.kv(key)
            written.append(ekey)
            success.append(op_delete(ekey) if w["deleted"]
                           else op_put(ekey, to_json({"value": w["value"]})))
        for skey, row in overlay.rec.items():
            ekey = skey.encode()
            written.append(ekey)
            success.append(op_put(ekey, to_json({"fields": row["fields"]})))
        for ekey in written:
            compares.append(cmp_mod(ekey, overlay.observed.get(ekey.decode(), 0)))
        outbox: list[bytes] = []
        outbox_values: dict[bytes, bytes] = {}
        seq = 0
        now = _now()
        for rec in snap.ordered():
            for eff in rec.get("effects", []):
                seq += 1
                okey, ovalue = self._outbox_entry(tx_id, seq, eff, now)
                outbox.append(okey)
                outbox_values[okey] = ovalue
                success.append(op_put(okey, ovalue))
        for lock in overlay.locks:
            success.append(op_delete(lock.encode()))
        success.append(op_delete_prefix(self.keys.tx_prefix(tx_id)))
        failure = [op_get(hkey)] + [op_get(k) for k in written]
        try:
            res = await self.store.txn(compares, success, failure, what="commit")  # round trip 2
        except StoreUnavailable:
            # Never retry a CAS blindly: re-read and decide (the commit may have applied).
            return await self._commit_fate(snap, overlay)
        if res.succeeded:
            failpoints.hit("commit.after_txn")
            steps = len(snap.live)
            log.info("transaction committed", extra={"tx": tx_id, "steps": steps,
                                                     "effects": len(outbox)})
            dispatched, dispatch_errors = await self._dispatch(
                [(k, res.revision) for k in outbox], outbox_values)
            return CommitOutcome(True, steps, dispatched, dispatch_errors)
        current = res.responses[0].response_range.kvs
        if not current:
            raise NotFound(f"transaction {tx_id} not found (unknown, committed or aborted)")
        if int(current[0].mod_revision) != snap.header_rev:
            raise FailedPrecondition(f"transaction {tx_id} was changed concurrently; retry commit")
        conflicts = []
        for ekey, r in zip(written, res.responses[1:], strict=True):
            kvs = r.response_range.kvs
            rev = int(kvs[0].mod_revision) if kvs else 0
            if rev != overlay.observed.get(ekey.decode(), 0):
                conflicts.append(_describe_data_key(self.keys, ekey))
        await self._compensate_and_end(snap, f"write-write conflict on {', '.join(conflicts)}")
        raise Conflict(
            f"commit aborted: write-write conflict on {', '.join(conflicts)} (another "
            f"transaction committed it after transaction {tx_id} read it); the transaction "
            "was compensated and ended")

    def _outbox_entry(self, tx_id: str, seq: int, eff: dict[str, Any],
                      now: float) -> tuple[bytes, bytes]:
        """The outbox record, claimed by this replica while the commit call delivers it."""
        if self.dispatcher is not None:
            from ..effects.channels import Effect

            return self.dispatcher.entry_for(  # type: ignore[no-any-return]
                Effect(eff["channel"], eff["payload"], eff["idempotency_key"], tx_id), seq)
        return self.keys.outbox(tx_id, seq), to_json({
            **eff, "transaction_id": tx_id, "seq": seq, "attempts": 0, "next_attempt_at": now,
            "claimed_by": None, "claim_until": 0.0, "last_error": None, "created_at": now})

    async def _commit_fate(self, snap: Snapshot, overlay: Overlay) -> CommitOutcome:
        try:
            hk = await self.store.get(self.keys.tx_header(snap.tx_id))
        except StoreUnavailable:
            raise StoreUnavailable(
                f"etcd unreachable while committing transaction {snap.tx_id}; the commit's "
                "outcome is unknown: call GetTransaction (NOT_FOUND means it applied)") from None
        if hk is not None and hk.mod_revision == snap.header_rev:
            raise StoreUnavailable(
                f"etcd timed out; transaction {snap.tx_id} was not committed; retry commit")
        if hk is None:
            # Gone: our commit applied (aborts and reaping also end it, but only after
            # reading this same header revision, which our CAS would then have lost to).
            return CommitOutcome(True, len(snap.live), 0, ["effects will be dispatched in the background"]
                                 if overlay.effects else [])
        raise FailedPrecondition(f"transaction {snap.tx_id} was changed concurrently")

    async def _compensate_and_end(self, snap: Snapshot, why: str) -> None:
        errors, _, _ = await self._undo_and_finish(snap, list(reversed(snap.live)), {}, end=True)
        if errors:
            log.error("compensation failed", extra={"tx": snap.tx_id, "why": why, "errors": errors})
            raise Conflict(f"commit aborted: {why}; compensation failed ({'; '.join(errors)}): "
                           "call RollbackTransaction to finish undoing")
        log.info("transaction aborted", extra={"tx": snap.tx_id, "why": why})

    async def _dispatch(self, entries: list[tuple[bytes, int]],
                        values: dict[bytes, bytes]) -> tuple[int, list[str]]:
        """Deliver what the commit just put in the outbox: one etcd write per delivered
        effect retires its entry (a confirmed delivery is never repeated)."""
        if not entries or self.dispatcher is None:
            return 0, []
        try:
            return await self.dispatcher.deliver_committed(  # type: ignore[no-any-return]
                entries, values)
        except Exception as exc:  # delivery never fails a commit that applied
            log.exception("dispatch after commit failed")
            return 0, [f"dispatch deferred to background: {type(exc).__name__}"]

    # ------------------------------------------------------------------ reaper
    async def expire(self, tx_id: str, header_rev: int, fence: Callable[[], Sequence[Any]]) -> bool:
        """Abort an idle transaction and compensate it. Every write carries `fence()`
        (the reaper's leadership compares), so a paused ex-leader cannot act. Returns
        False when the transaction moved on meanwhile (it is not idle any more)."""
        snap = await self._load(tx_id)
        if snap.header_rev != header_rev:
            return False
        errors, done, _ = await self._undo_and_finish(snap, list(reversed(snap.live)), {},
                                                      end=True, fence=fence)
        if errors:
            log.error("idle transaction could not be compensated",
                      extra={"tx": tx_id, "errors": errors})
            return False
        log.info("idle transaction expired", extra={"tx": tx_id, "undone": done})
        return True

    # ------------------------------------------------------------------ list
    async def list_transactions(self, page_size: int, page_token: str, status: str | None,
                                agent_id_prefix: str) -> tuple[list[TransactionSummary], str]:
        """One page of open transactions in key (= id) order, and the next page's token.

        A minimal, self-contained version (the engine rewrite replaces it): the token is
        the etcd key to resume from, the transaction subtree is scanned keys-only in
        bounded chunks, and only header values are read, in batches. Cost per page is
        bounded by `page_size` and the step keys of the listed transactions, never by how
        much data other transactions hold. `status` None means every open status."""
        tx_prefix = self.keys.all_tx_prefix()
        end = prefix_end(tx_prefix)
        start = _decode_page_token(page_token, tx_prefix)
        wanted = (status,) if status else OPEN_STATUSES
        found: list[TransactionSummary] = []
        while True:
            res = await self.store.txn([], [_range_op(start, end, LIST_SCAN_KEYS)],
                                       what="list scan")
            scanned = res.responses[0].response_range
            keys = [bytes(kv.key) for kv in scanned.kvs]
            headers = [k for k in keys
                       if k.endswith(b"/header") and k[len(tx_prefix):].count(b"/") == 1]
            for i in range(0, len(headers), LIST_HEADER_BATCH):
                batch = headers[i:i + LIST_HEADER_BATCH]
                read = await self.store.read(batch, what="list headers")
                for key in batch:
                    kv = read.single[key]
                    if kv is None:  # ended since the scan
                        continue
                    h = from_json(kv.value)
                    if h.get("status") not in wanted or \
                            not str(h.get("agent_id", "")).startswith(agent_id_prefix):
                        continue
                    found.append(TransactionSummary(
                        transaction_id=str(h["id"]), status=str(h["status"]),
                        agent_id=str(h.get("agent_id", "")),
                        principal=str(h.get("principal", "")),
                        next_step_id=int(h["next_step_id"]),
                        created_at=float(h.get("created_at", 0.0)),
                        updated_at=float(h.get("updated_at", 0.0))))
                    if len(found) == page_size:
                        return found, _encode_page_token(key + b"\0", tx_prefix)
            if not scanned.more or not keys:
                return found, ""
            start = keys[-1] + b"\0"

    # ------------------------------------------------------------------ get
    async def get(self, tx_id: str) -> TransactionView:
        snap = await self._load(tx_id)                                 # round trip 1
        try:
            snap = await self._settle(snap)
        except FailedPrecondition:
            pass  # still in flight on a live replica: show the state as it stands
        h = snap.header
        touch = self.keys.tx_touch(tx_id)
        try:  # activity for the idle reaper; only while the header exists
            await self.store.txn([cmp_mod(self.keys.tx_header(tx_id), snap.header_rev)],
                                 [op_put(touch, str(_now()).encode())], what="touch")
        except StoreUnavailable:
            pass
        context = [ContextItem(r["step_id"], r["tool"], r["raw_context"])
                   for r in snap.ordered() if r.get("raw_context")]
        return TransactionView(tx_id, h["status"], h["next_step_id"], list(h["constraints"]),
                               h["global_resets"], h["agent_id"], context)


def _is_custom_saga(tool: Any) -> bool:
    """SAGA tools other than fs.write (whose undo the engine does itself from its record)."""
    return tool is not None and tool.rollback is RollbackKind.SAGA and tool.name != "fs.write"


def ctx_cleanup(ctx: StepContext) -> None:
    if ctx.fs:
        sandbox.discard_temp(pathlib.Path(ctx.fs["tmp"]))


def _offending_ref(argument: str | None, provenance: dict[str, int]) -> int | None:
    if not argument:
        return None
    if argument in provenance:
        return provenance[argument]
    # a reference deeper inside the offending argument (e.g. fields.a.b)
    for path, step in provenance.items():
        if path.startswith(argument + "."):
            return step
    return None


def _range_op(start: bytes, end: bytes, limit: int) -> Any:
    """A keys-only range read of at most `limit` keys in [start, end), built from the
    store's own op constructor so the engine needs no etcd message types."""
    op = op_get(start)
    op.request_range.range_end = end
    op.request_range.limit = limit
    op.request_range.keys_only = True
    return op


def _encode_page_token(resume_key: bytes, tx_prefix: bytes) -> str:
    return base64.urlsafe_b64encode(resume_key[len(tx_prefix):]).decode().rstrip("=")


def _decode_page_token(token: str, tx_prefix: bytes) -> bytes:
    if not token:
        return tx_prefix
    try:
        rest = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("page_token is not a token returned by ListTransactions") from None
    return tx_prefix + rest


def _describe_os_error(exc: BaseException, rec: dict[str, Any]) -> str:
    fs = rec.get("fs")
    if isinstance(exc, OSError) and fs:
        return f"cannot restore '{fs['path']}': {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


def _describe_data_key(keys: Keys, ekey: bytes) -> str:
    from urllib.parse import unquote

    text = ekey.decode()[len(keys.prefix):]
    parts = text.strip("/").split("/")
    if parts[:2] == ["data", "kv"]:
        return f'kv key "{unquote(parts[2])}"'
    if parts[:2] == ["data", "rec"]:
        return f'row id={unquote(parts[3])} in table "{parts[2]}"'
    return text


def _dedupe_ops(ops: list[Any]) -> list[Any]:
    """etcd rejects a Txn that writes the same key twice ("duplicate key given in txn")."""
    seen: set[bytes] = set()
    out = []
    for op in ops:
        which = op.WhichOneof("request")
        key = bytes(getattr(op, which).key)
        if key in seen:
            continue
        seen.add(key)
        out.append(op)
    return out


__all__ = ["Engine", "Snapshot", "TransactionSummary"]
