"""Every state change as data: the compares and operations of ONE etcd transaction.

These are pure functions of typed state (no I/O, no clock), in the manner of etcd's STM
(`conflicts()` and `wset.puts()` are pure functions of the read and write sets): each
one returns a `TxnPlan` the engine sends, and each is unit-tested without etcd
(tests/unit/test_engine_ops.py). Every plan compares the transaction header's
mod_revision, so two replicas racing on one transaction produce exactly one winner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..contracts.layout import Keys
from ..contracts.outbox import reservation_value
from ..store.ops import (
    Compare,
    Delete,
    Get,
    Op,
    Put,
    cmp_absent,
    cmp_mod,
    cmp_value,
    op_delete_from,
    op_delete_prefix,
)
from .state import (
    GatedCall,
    StagedEffect,
    StepRecord,
    Touched,
    TxHeader,
    WriteState,
    encode_context,
    encode_effect,
    encode_gated,
    encode_header,
    encode_step,
    encode_touched,
    to_json,
)


@dataclass(frozen=True)
class TxnPlan:
    compares: list[Compare]
    success: list[Op]
    failure: list[Op] = field(default_factory=list)

    @property
    def request_bytes(self) -> int:
        """Approximate size of the etcd request (keys and values)."""
        total = 0
        for op in self.success:
            total += len(op.key) + (len(op.value) if isinstance(op, Put) else 0) + 8
        for c in self.compares:
            total += len(c.key) + (len(c.operand) if isinstance(c.operand, bytes) else 8) + 8
        return total


def is_data_key(data_key: bytes) -> bool:
    """Committed data (kv, records) as opposed to an fs pseudo-key."""
    return not data_key.startswith(b"fs:")


# ---- a step whose CAS outcome is unknown ---------------------------------------------

def fence_unknown_step_plan(keys: Keys, header: TxHeader, rev: int) -> TxnPlan:
    """After a step CAS that timed out: make its outcome final before deciding about it.

    The lost request compared the header's mod_revision with `rev` and may still be
    applied by etcd after any read we make (etcd serves a read beside a write it has not
    finished). Rewriting the header at `rev` (the same record) moves its revision on, so
    that request can never apply later; if the header already moved, the step (or
    something else) was recorded first. Either way the header read in the same
    transaction is final: success branch = the step was not recorded and never will be;
    failure branch = read what is there."""
    hkey = keys.tx_header(header.id)
    return TxnPlan([cmp_mod(hkey, rev)], [Put(hkey, encode_header(header))], [Get(hkey)])


# ---- a step that applied -------------------------------------------------------------

@dataclass(frozen=True)
class StepChanges:
    """What one step attempt did, as the view recorded it."""

    observed: Mapping[bytes, int]                       # first touches: key -> assumed rev
    entries: Mapping[bytes, Touched]                    # every entry the step (re)writes
    assumed: Mapping[bytes, int] | None = None          # every committed state relied on
    effects: Sequence[StagedEffect] = ()
    reservations: Sequence[bytes] = ()
    lock_new: bytes | None = None
    lock_held: bytes | None = None


def step_plan(keys: Keys, header: TxHeader, rev: int, new_header: TxHeader,
              record: StepRecord | None, raw_context: str, changes: StepChanges, *,
              history: Sequence[Put] = (), gated: Sequence[GatedCall] = (),
              output: bytes | None = None) -> TxnPlan:
    """The CAS of a step: new header, the step record (None for a failed step, which
    records only what it observed), its raw_context, touched entries, staged effects,
    reservations, lock, its history entry and, when its tool needs approval, its gated
    call. Its failure branch reads back everything it compared, so a lost compare tells
    the engine what actually changed (`read_back_keys`). `output`: the record's output as
    the step already encoded it (state.encode_step)."""
    tx = header.id
    hkey = keys.tx_header(tx)
    compares: list[Compare] = [cmp_mod(hkey, rev)]
    assumed = changes.assumed if changes.assumed is not None else changes.observed
    for dk, seen in assumed.items():
        if is_data_key(dk):
            compares.append(cmp_mod(dk, seen))
    success: list[Op] = [Put(hkey, encode_header(new_header))]
    if record is not None:
        success.append(Put(keys.step(tx, record.step_id), encode_step(record, output)))
        if raw_context:
            success.append(Put(keys.context(tx, record.step_id),
                               encode_context(record.tool, raw_context)))
    for dk, entry in changes.entries.items():
        success.append(Put(keys.touched(tx, dk), encode_touched(entry)))
    if record is not None:
        for i, effect in enumerate(changes.effects):
            success.append(Put(keys.effect(tx, record.step_id, i), encode_effect(effect)))
        for resv in changes.reservations:
            compares.append(cmp_absent(resv))
            success.append(Put(resv, reservation_value(tx, record.step_id, "staged")))
        if changes.lock_new is not None:
            compares.append(cmp_absent(changes.lock_new))
            success.append(Put(changes.lock_new, tx.encode()))
        elif changes.lock_held is not None:
            compares.append(cmp_value(changes.lock_held, tx.encode()))
        for i, call in enumerate(gated):
            success.append(Put(keys.gate(tx, record.step_id, i), encode_gated(call)))
    success.extend(history)
    failure: list[Op] = [Get(k) for k in read_back_keys(hkey, compares)]
    return TxnPlan(compares, success, failure)


def intent_plan(keys: Keys, header: TxHeader, rev: int, new_header: TxHeader,
                intent: bytes) -> TxnPlan:
    """The CAS before a toolset saga call: the header with its `SagaPending` marker and
    what the call is (`tx/<id>/intent`), so a crash between the call and the step's own
    CAS is found and settled (docs/toolsets.md, "Crash windows")."""
    hkey = keys.tx_header(header.id)
    return TxnPlan([cmp_mod(hkey, rev)],
                   [Put(hkey, encode_header(new_header)), Put(keys.saga_intent(header.id), intent)],
                   [Get(hkey)])


def read_back_keys(header_key: bytes, compares: Sequence[Compare]) -> list[bytes]:
    """The keys a plan's failure branch reads: the header, then each compared key once."""
    out = [header_key]
    seen = {header_key}
    for c in compares:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c.key)
    return out


def step_entries(before: Mapping[bytes, tuple[int | None, WriteState]],
                 states: Mapping[bytes, WriteState], observed: Mapping[bytes, int],
                 known: Mapping[bytes, Touched | None]) -> dict[bytes, Touched]:
    """The touched entries a successful step writes: keys it wrote get their new state;
    keys it only read for the first time get an entry with the observed revision."""
    out: dict[bytes, Touched] = {}
    for dk, state in states.items():
        prior = known.get(dk)
        seen = prior.observed if prior is not None else before.get(dk, (None, state))[0]
        if seen is None and is_data_key(dk):
            seen = observed.get(dk, 0)
        out[dk] = Touched(seen, state)
    for dk, seen in observed.items():
        if dk not in out and known.get(dk) is None:
            out[dk] = Touched(seen)
    return out


def observation_entries(observed: Mapping[bytes, int],
                        known: Mapping[bytes, Touched | None]) -> dict[bytes, Touched]:
    """What a failed step records: the keys it read for the first time
    (docs/architecture.md#isolation-and-commit-serializable: failed reads are part of the read
    set), nothing it would have written."""
    return {dk: Touched(seen) for dk, seen in observed.items()
            if is_data_key(dk) and known.get(dk) is None}


# ---- undo ----------------------------------------------------------------------------

def undone_entries(done: Sequence[StepRecord]) -> dict[bytes, Touched]:
    """Each key the undone steps wrote, back to its state before the earliest of them.
    `done` is in undo order (descending step ids), so the last assignment wins."""
    out: dict[bytes, Touched] = {}
    for record in done:
        for image in record.undo:
            out[image.data_key] = Touched(image.observed, image.state)
    return out


def rollback_plan(keys: Keys, header: TxHeader, rev: int, new_header: TxHeader,
                  done: Sequence[StepRecord], *, fence: Sequence[Compare] = (),
                  observations: Mapping[bytes, Touched] | None = None,
                  observed: Mapping[bytes, int] | None = None,
                  history: Sequence[Put] = ()) -> TxnPlan:
    """The CAS that records undone steps (`done`, a suffix of the live steps, in undo
    order): their records, contexts, effects and gated calls deleted, their keys'
    entries restored, their reservations and locks released, the new header written
    (and the failed step's history entry, when a failure caused it). A transaction that
    was awaiting approval and does not end here is no longer listed as pending."""
    tx = header.id
    hkey = keys.tx_header(tx)
    compares: list[Compare] = [cmp_mod(hkey, rev), *fence]
    for dk, seen in (observed or {}).items():
        if is_data_key(dk):
            compares.append(cmp_mod(dk, seen))
    success: list[Op] = [Put(hkey, encode_header(new_header))]
    if done:
        first = min(r.step_id for r in done)
        success.append(op_delete_from(keys.step(tx, first), keys.steps_prefix(tx)))
        success.append(op_delete_from(keys.context(tx, first), keys.context_prefix(tx)))
        success.append(op_delete_from(keys.effect(tx, first, 0), keys.effects_prefix(tx)))
        success.append(op_delete_from(keys.gate(tx, first, 0), keys.gates_prefix(tx)))
    entries = dict(observations or {})
    entries.update(undone_entries(done))
    for dk, entry in entries.items():
        success.append(Put(keys.touched(tx, dk), encode_touched(entry)))
    for record in done:
        for resv in record.effect_keys:
            success.append(Delete(resv))
        if record.fs is not None and record.fs.lock_new:
            compares.append(cmp_value(record.fs.lock_key, tx.encode()))
            success.append(Delete(record.fs.lock_key))
    if new_header.pending is None:
        success.extend(leave_approval_ops(keys, header))
    success.extend(history)
    return TxnPlan(compares, success, [Get(k) for k in read_back_keys(hkey, compares)])


def end_ops(keys: Keys, header: TxHeader, *, locks: Iterable[bytes],
            reservations: Iterable[bytes]) -> list[Op]:
    """Everything that ends a transaction: its keys, header, activity key and quota slot,
    the locks it holds and (for an abort) the idempotency keys it reserved."""
    tx = header.id
    ops: list[Op] = [op_delete_prefix(keys.tx_prefix(tx)), Delete(keys.tx_header(tx)),
                     Delete(keys.tx_touch(tx))]
    if header.quota_slot >= 0:
        ops.append(Delete(keys.open_slot(header.principal, header.quota_slot)))
    if header.pending is not None:  # it was awaiting approval: no longer listed
        ops.append(Delete(keys.approval(tx)))
    for lock in dict.fromkeys(locks):
        ops.append(Delete(lock))
    for resv in dict.fromkeys(reservations):
        ops.append(Delete(resv))
    return ops


def abort_plan(keys: Keys, header: TxHeader, rev: int, *, locks: Iterable[bytes],
               reservations: Iterable[bytes], fence: Sequence[Compare] = (),
               observed: Mapping[bytes, int] | None = None,
               history: Sequence[Put] = ()) -> TxnPlan:
    """End the transaction without applying anything (abort, expiry, conflict), with its
    history's end record (and the failed step's entry, when a failure ended it)."""
    hkey = keys.tx_header(header.id)
    compares: list[Compare] = [cmp_mod(hkey, rev), *fence]
    for dk, seen in (observed or {}).items():
        if is_data_key(dk):
            compares.append(cmp_mod(dk, seen))
    success = end_ops(keys, header, locks=locks, reservations=reservations)
    success.extend(history)
    return TxnPlan(compares, success, [Get(k) for k in read_back_keys(hkey, compares)])


# ---- commit --------------------------------------------------------------------------

@dataclass(frozen=True)
class CommitSnapshot:
    """Everything commit needs: the header as read, every touched entry, every staged
    effect (in step order) and the outbox entries they become."""

    header: TxHeader
    rev: int
    entries: Mapping[bytes, Touched]
    effects: Sequence[StagedEffect]
    outbox: Sequence[tuple[bytes, bytes]]          # (key, value) per effect, same order


def commit_plan(keys: Keys, snap: CommitSnapshot, *, reservation_lease: int = 0,
                history: Sequence[Put] = ()) -> TxnPlan:
    """The commit (docs/architecture.md#isolation-and-commit-serializable), as etcd's STM does
    it: compare every key of the read and write sets with the revision the transaction first
    observed (0 = absent), apply the buffered writes, move staged effects to the outbox
    (re-reserving their idempotency keys for the retention window), release locks, end the
    transaction. Linear in the touched keys and effects; independent of how many steps ran."""
    h = snap.header
    hkey = keys.tx_header(h.id)
    compares: list[Compare] = [cmp_mod(hkey, snap.rev)]
    writes: list[Op] = []
    locks: list[bytes] = []
    for dk, entry in sorted(snap.entries.items()):
        if not is_data_key(dk):
            if entry.state.lock:
                locks.append(entry.state.lock)
            continue
        if entry.observed is not None:
            compares.append(cmp_mod(dk, entry.observed))
        w = entry.state.write
        if w is not None:
            writes.append(Delete(dk) if w.deleted else Put(dk, w.raw or to_json(w.doc)))
    success: list[Op] = writes
    for key, value in snap.outbox:
        success.append(Put(key, value))
    for effect in snap.effects:
        success.append(Put(keys.effect_key(h.principal, effect.idempotency_key),
                           reservation_value(h.id, 0, "committed"), lease=reservation_lease))
    success.extend(end_ops(keys, h, locks=locks, reservations=()))
    success.extend(history)  # the end record: one small key
    return TxnPlan(compares, success, [Get(hkey)])



# ---- approval ------------------------------------------------------------------------

def gate_plan(keys: Keys, header: TxHeader, rev: int, awaiting: TxHeader,
              approval_record: bytes, notify: Sequence[tuple[bytes, bytes]] = ()) -> TxnPlan:
    """The commit that stops at the gate (docs/approvals.md): the header becomes
    AWAITING_APPROVAL (`awaiting`, with its pending digest), the pending approval is
    listed (`Keys.approval`) and the notify event, if any, enters the outbox, all in one
    compare-and-swap on the header. Nothing else is written: the data stays buffered
    until a decision."""
    hkey = keys.tx_header(header.id)
    success: list[Op] = [Put(hkey, encode_header(awaiting)),
                         Put(keys.approval(header.id), approval_record)]
    success.extend(Put(key, value) for key, value in notify)
    return TxnPlan([cmp_mod(hkey, rev)], success, [Get(hkey)])


def leave_approval_ops(keys: Keys, header: TxHeader) -> list[Op]:
    """What a transaction that stops awaiting approval without ending (an undo failed
    while it was rejected) must also write: it is no longer listed."""
    return [Delete(keys.approval(header.id))] if header.pending is not None else []
