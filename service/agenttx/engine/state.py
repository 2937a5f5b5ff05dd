"""What a transaction is in etcd: typed records and the one place they are (de)coded.

Layout (contracts.layout):

    txh/<id>               TxHeader     the compare-and-swap anchor; small and of constant
                                        size (counters and budgets, not lists of steps)
    tx/<id>/step/<n>       StepRecord   a live step: output, undo images, fs intent
    tx/<id>/ctx/<n>        raw bytes    the step's raw_context (GetTransaction only)
    tx/<id>/key/<data key> Touched      the transaction's view of one data key: the revision
                                        it observed first (read set) and its buffered write
    tx/<id>/fx/<n>/<i>     StagedEffect an effect staged by live step n
    tx/<id>/gate/<n>/<i>   GatedCall    what live step n will do that needs approval: a
                                        gated effect, or a gated tool's call (docs/approvals.md)
    tx/<id>/meta           metadata     BeginTransaction.metadata (audit only)
    hist/<id>/...          history      kept after the end on shared leases (engine.history,
                                        which has its own records and codec)

Why this shape (cost does not grow:
docs/architecture.md#every-answer-fits-cost-does-not-grow): a step reads and writes the
header plus the entries of the keys it touches and nothing else, so step 500 costs what step 1
costs; commit reads the entries (its read and write sets) and the staged effects, so it is
linear in what the transaction touched, never in how many steps it ran.

Live steps are always 1 … next_step_id − 1: a step applies at next_step_id and every
rollback undoes a suffix (a dependency jump, a reset, a manual rollback, an interrupted
write), so the header never lists them.

Every record is a frozen dataclass; a state change builds new records and writes them
in one etcd transaction. Nothing is mutated in place and persisted "by the next write".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..contracts.policy import ApprovalSettings, approval_from_spec, approval_to_spec

ACTIVE = "ACTIVE"
AWAITING_ROLLBACK = "AWAITING_ROLLBACK"
AWAITING_APPROVAL = "AWAITING_APPROVAL"


def to_json(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def from_json(raw: bytes) -> Any:
    return json.loads(raw)


# ---- header ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TxPolicy:
    """The effective policy, resolved once at begin (docs/recovery.md#the-policy)."""

    max_local_depth: int
    max_global_resets: int
    replay_budget_factor: float
    idle_timeout_s: int
    fs_root: str
    source: str


@dataclass(frozen=True, slots=True)
class Budget:
    """What the transaction holds, kept up to date by every step so limits are checked
    without reading the steps (docs/architecture.md#every-answer-fits-cost-does-not-grow)."""

    read_keys: int = 0       # entries with an observed revision: commit compares
    write_keys: int = 0      # entries with a buffered write: commit puts/deletes
    write_bytes: int = 0     # bytes those writes put
    effects: int = 0         # staged effects: outbox puts at commit
    effect_bytes: int = 0
    locks: int = 0           # fs locks held
    context_bytes: int = 0   # raw_context of live steps: GetTransaction's context log
    gated_bytes: int = 0     # resolved arguments of gated steps (the approval's record)

    def plus(self, other: Budget) -> Budget:
        return Budget(*(a + b for a, b in zip(_fields(self), _fields(other), strict=True)))

    def minus_undone(self, other: Budget) -> Budget:
        """Undo a step's delta; the read set is never shrunk
        (docs/architecture.md#isolation-and-commit-serializable: every key the transaction
        read, failed reads included, is validated at commit)."""
        return Budget(self.read_keys, *(a - b for a, b in
                                        zip(_fields(self)[1:], _fields(other)[1:], strict=True)))


def _fields(b: Budget) -> tuple[int, ...]:
    return (b.read_keys, b.write_keys, b.write_bytes, b.effects, b.effect_bytes, b.locks,
            b.context_bytes, b.gated_bytes)


@dataclass(frozen=True, slots=True)
class FsPending:
    """An fs.write committed in etcd whose rename over the target may not have happened
    yet (docs/architecture.md#fs-writes-atomic-and-crash-recoverable). Set by the
    fs step's CAS; every later state change first checks whether the step's temp file is still
    there (the rename removes it) and clears the marker, or rolls the write back. The target's
    contents are never consulted: an acknowledged step is final, whatever happens to its file afterwards."""

    step_id: int
    attempt: str
    owner: str
    since: float
    target: str


@dataclass(frozen=True, slots=True)
class SagaPending:
    """A toolset saga call that may have reached its upstream before its step was
    recorded (docs/toolsets.md, "Crash windows"). Set by one CAS before the call (the
    call's arguments, idempotency key and compensation are in `tx/<id>/intent`, so the
    header keeps its constant size), cleared by the step's own CAS. A replica that finds
    it set once `owner` is gone (or `until` passed) cannot know whether the upstream
    acted: it compensates from the arguments, or holds the transaction for a manual
    rollback when the compensation needs the call's output."""

    step_id: int
    attempt: str
    owner: str
    since: float
    until: float                    # the call cannot still be running after this
    # a RollbackTransaction was told that this call needs a person (its compensation
    # needs the call's output); the next one releases it
    reported: bool = False


@dataclass(frozen=True, slots=True)
class UndoIntent:
    """A rollback in progress: durable before any file or saga is undone, so a replica
    that dies half-way leaves a plan any replica resumes (undo actions are idempotent).
    Reaching `next_step_id` etc. afterwards, or the end of the transaction when `end`."""

    steps: tuple[int, ...]          # descending
    owner: str
    since: float
    end: bool
    automatic: bool                 # automatic rollbacks count as replay (docs/recovery.md#4-the-planner)
    next_step_id: int = 0
    global_resets: int = 0
    replay_used: int = 0
    # end: how it ends (status, ended_by, reason), for the history of whoever finishes it
    ending: tuple[str, str, str] | None = None


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """The transaction asked for approval at commit (status AWAITING_APPROVAL): what the
    approver must name (`digest`), and until when (the reaper rejects it then)."""

    digest: str
    requested_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class TxHeader:
    id: str
    principal: str
    agent_id: str
    status: str
    policy: TxPolicy
    created_at: float
    updated_at: float
    next_step_id: int = 1
    attempts: int = 0               # failed attempts at next_step_id since it became next
    highest_step: int = 0
    replay_used: int = 0
    global_resets: int = 0
    constraints: tuple[str, ...] = ()
    budget: Budget = field(default_factory=Budget)
    quota_slot: int = -1            # <prefix>/open/<principal>/<slot>, -1: none
    fs_pending: FsPending | None = None
    undoing: UndoIntent | None = None
    history_seq: int = 0            # history entries written (engine.history): the next key
    history_lease: int = 0          # the lease its history entries are on (0: none yet)
    saga_pending: SagaPending | None = None
    # the effective approval, resolved at begin (None: nothing is gated), and the
    # namespace of the principal (whose approvers may decide; docs/approvals.md)
    approval: ApprovalSettings | None = None
    namespace: str | None = None
    pending: PendingApproval | None = None

    @property
    def live(self) -> range:
        return range(1, self.next_step_id)


# ---- touched keys ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Buffered:
    """A buffered write: the document commit puts (`{"value": v}` / `{"fields": f}`), or a
    tombstone (delete)."""

    deleted: bool
    doc: Any = None
    size: int = 0
    # `doc` encoded, as the step that buffered it encoded it (not stored: derived), so a
    # commit from this replica's cache does not encode every write again.
    raw: bytes = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class WriteState:
    """The part of a touched entry that live steps change (and undo restores)."""

    write: Buffered | None = None
    writer: int = 0                 # last live step that wrote/deleted it (0: none)
    writer_op: str = ""             # "put", "delete" or "both" (by the writer step)
    lock: bytes = b""               # fs ids: the file lock this transaction holds


NO_WRITE = WriteState()


@dataclass(frozen=True, slots=True)
class Touched:
    """tx/<id>/key/<data key>: the transaction's view of one data key."""

    observed: int | None            # mod_revision when first touched (0 = absent); None: fs
    state: WriteState = NO_WRITE


# ---- steps ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FsWrite:
    """fs.write's undo record (saga): durable before the file changes."""

    path: str                       # as the agent spelled it relative to the root (messages)
    rel: str                        # resolved, relative to the resolved root (data id)
    target: str                     # resolved absolute path
    lock_key: bytes
    lock_new: bool                  # this step took the lock (undo releases it)
    existed: bool
    previous: bytes | None          # previous bytes (None: the file did not exist)
    new_sha256: str


@dataclass(frozen=True, slots=True)
class UndoImage:
    """A key's entry before the step that wrote it: undo puts it back."""

    data_key: bytes
    observed: int | None
    state: WriteState


@dataclass(frozen=True, slots=True)
class StagedEffect:
    channel: str
    payload: Any
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class GatedCall:
    """tx/<id>/gate/<n>/<i>: what live step n will do that needs approval, recorded by
    the step itself (docs/approvals.md): an effect it staged on a gated channel, or
    staged while its tool is gated (`channel` and the payload), else the call of a gated
    tool (`channel` "", its resolved arguments). The approver sees it; the digest binds
    it."""

    step_id: int
    tool: str
    channel: str
    arguments: Any


@dataclass(frozen=True, slots=True)
class StepRecord:
    step_id: int
    tool: str
    attempt: str                    # nonce: tells this attempt's record apart after a timeout
    output: Any
    refs: tuple[int, ...] = ()
    undo: tuple[UndoImage, ...] = ()                  # each key's entry before this step
    effect_keys: tuple[bytes, ...] = ()               # idempotency reservations to release
    effects: int = 0
    fs: FsWrite | None = None
    saga: Any = None                # a custom saga tool's compensation
    has_saga: bool = False
    context_bytes: int = 0
    delta: Budget = field(default_factory=Budget)


# ---- codec ----------------------------------------------------------------------------
# Compact keys keep the records small; every field is named here and nowhere else.

def _budget_doc(b: Budget) -> list[int]:
    return list(_fields(b))


def _budget(doc: list[int] | None) -> Budget:
    return Budget(*doc) if doc else Budget()


def encode_header(h: TxHeader) -> bytes:
    p = h.policy
    doc: dict[str, Any] = {
        "id": h.id, "pr": h.principal, "ag": h.agent_id, "st": h.status,
        "po": [p.max_local_depth, p.max_global_resets, p.replay_budget_factor,
               p.idle_timeout_s, p.fs_root, p.source],
        "ca": h.created_at, "ua": h.updated_at, "nx": h.next_step_id, "at": h.attempts,
        "hi": h.highest_step, "ru": h.replay_used, "gr": h.global_resets,
        "co": list(h.constraints), "bu": _budget_doc(h.budget), "qs": h.quota_slot,
    }
    if h.fs_pending is not None:
        f = h.fs_pending
        doc["fp"] = [f.step_id, f.attempt, f.owner, f.since, f.target]
    if h.undoing is not None:
        u = h.undoing
        doc["un"] = [list(u.steps), u.owner, u.since, u.end, u.automatic, u.next_step_id,
                     u.global_resets, u.replay_used]
        if u.ending is not None:
            doc["un"].append(list(u.ending))
    if h.history_seq:
        doc["hs"] = h.history_seq
    if h.history_lease:
        doc["hl"] = h.history_lease
    if h.saga_pending is not None:
        g = h.saga_pending
        doc["sp"] = [g.step_id, g.attempt, g.owner, g.since, g.until, g.reported]
    if h.approval is not None:
        doc["ap"] = approval_to_spec(h.approval)
    if h.namespace is not None:
        doc["ns"] = h.namespace
    if h.pending is not None:
        doc["pa"] = [h.pending.digest, h.pending.requested_at, h.pending.expires_at]
    return to_json(doc)


def decode_header(raw: bytes) -> TxHeader:
    d = from_json(raw)
    po = d["po"]
    fp = d.get("fp")
    un = d.get("un")
    sp = d.get("sp")
    pa = d.get("pa")
    return TxHeader(
        id=d["id"], principal=d["pr"], agent_id=d["ag"], status=d["st"],
        policy=TxPolicy(int(po[0]), int(po[1]), float(po[2]), int(po[3]), po[4], po[5]),
        created_at=d["ca"], updated_at=d["ua"], next_step_id=d["nx"], attempts=d["at"],
        highest_step=d["hi"], replay_used=d["ru"], global_resets=d["gr"],
        constraints=tuple(d["co"]), budget=_budget(d.get("bu")), quota_slot=d.get("qs", -1),
        fs_pending=FsPending(fp[0], fp[1], fp[2], fp[3], fp[4]) if fp else None,
        undoing=UndoIntent(tuple(un[0]), un[1], un[2], un[3], un[4], un[5], un[6], un[7],
                           tuple(un[8]) if len(un) > 8 else None)  # type: ignore[arg-type]
        if un else None,
        history_seq=d.get("hs", 0), history_lease=d.get("hl", 0),
        saga_pending=SagaPending(sp[0], sp[1], sp[2], sp[3], sp[4], sp[5]) if sp else None,
        approval=approval_from_spec(d["ap"]) if "ap" in d else None,
        namespace=d.get("ns"),
        pending=PendingApproval(pa[0], float(pa[1]), float(pa[2])) if pa else None,
    )


def _state_doc(s: WriteState) -> list[Any]:
    w = s.write
    return [None if w is None else [w.deleted, w.doc, w.size], s.writer, s.writer_op,
            s.lock.decode()]


def _state(doc: list[Any]) -> WriteState:
    w = doc[0]
    return WriteState(None if w is None else Buffered(w[0], w[1], w[2]), doc[1], doc[2],
                      doc[3].encode())


def encode_touched(t: Touched) -> bytes:
    return to_json([t.observed, _state_doc(t.state)])


def decode_touched(raw: bytes) -> Touched:
    d = from_json(raw)
    return Touched(d[0], _state(d[1]))


def encode_step(r: StepRecord, output: bytes | None = None) -> bytes:
    """`output`: `r.output` already encoded by `to_json` (the step encodes its output once,
    for the response, the size check and this record), spliced in as the last member
    instead of being encoded again; decode_step reads the same document either way."""
    doc: dict[str, Any] = {
        "id": r.step_id, "tl": r.tool, "at": r.attempt, "rf": list(r.refs),
        "un": [[u.data_key.decode(), u.observed, _state_doc(u.state)] for u in r.undo],
        "ek": [k.decode() for k in r.effect_keys], "fx": r.effects,
        "cb": r.context_bytes, "bu": _budget_doc(r.delta),
    }
    if r.fs is not None:
        f = r.fs
        doc["fs"] = [f.path, f.rel, f.target, f.lock_key.decode(), f.lock_new, f.existed,
                     None if f.previous is None else _b64(f.previous), f.new_sha256]
    if r.has_saga:
        doc["sg"] = r.saga
    if output is None:
        doc["out"] = r.output
        return to_json(doc)
    return to_json(doc)[:-1] + b',"out":' + output + b"}"


def decode_step(raw: bytes) -> StepRecord:
    d = from_json(raw)
    fs = d.get("fs")
    return StepRecord(
        step_id=d["id"], tool=d["tl"], attempt=d["at"], output=d["out"], refs=tuple(d["rf"]),
        undo=tuple(UndoImage(k.encode(), o, _state(s)) for k, o, s in d["un"]),
        effect_keys=tuple(k.encode() for k in d["ek"]), effects=d["fx"],
        fs=FsWrite(fs[0], fs[1], fs[2], fs[3].encode(), fs[4], fs[5],
                   None if fs[6] is None else _unb64(fs[6]), fs[7]) if fs else None,
        saga=d.get("sg"), has_saga="sg" in d, context_bytes=d["cb"], delta=_budget(d["bu"]),
    )


def encode_context(tool: str, raw_context: str) -> bytes:
    """tx/<id>/ctx/<n>: the tool name (length-prefixed) and the raw_context bytes, so
    GetTransaction reads the context log without the step records."""
    name = tool.encode()
    return b"%d:" % len(name) + name + raw_context.encode("utf-8", "surrogatepass")


def decode_context(raw: bytes) -> tuple[str, str]:
    head, _, rest = raw.partition(b":")
    n = int(head)
    return rest[:n].decode(), rest[n:].decode("utf-8", "surrogatepass")


def encode_gated(g: GatedCall) -> bytes:
    return to_json([g.step_id, g.tool, g.channel, g.arguments])


def decode_gated(raw: bytes) -> GatedCall:
    d = from_json(raw)
    return GatedCall(int(d[0]), d[1], d[2], d[3])


def encode_effect(e: StagedEffect) -> bytes:
    return to_json([e.channel, e.payload, e.idempotency_key])


def decode_effect(raw: bytes) -> StagedEffect:
    d = from_json(raw)
    return StagedEffect(d[0], d[1], d[2])


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    import base64

    return base64.b64decode(text)
