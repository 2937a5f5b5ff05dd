"""The pure builders of every state change (engine/ops.py) and the stored codec
(engine/state.py), without etcd: what each etcd transaction compares and writes."""

from __future__ import annotations

import json

import pytest

from agenttx.contracts.layout import Keys, fs_id
from agenttx.engine.ops import (
    CommitSnapshot,
    StepChanges,
    abort_plan,
    commit_plan,
    fence_unknown_step_plan,
    observation_entries,
    rollback_plan,
    step_entries,
    step_plan,
    undone_entries,
)
from agenttx.engine.state import (
    ACTIVE,
    Budget,
    Buffered,
    FsPending,
    FsWrite,
    StagedEffect,
    StepRecord,
    Touched,
    TxHeader,
    TxPolicy,
    UndoImage,
    UndoIntent,
    WriteState,
    decode_context,
    decode_effect,
    decode_header,
    decode_step,
    decode_touched,
    encode_context,
    encode_effect,
    encode_header,
    encode_step,
    encode_touched,
)
from agenttx.store.ops import Delete, Get, Put, cmp_absent, cmp_mod, cmp_value

KEYS = Keys("/p")
TX = "3f1c2b9e-0000-4000-8000-000000000001"
POLICY = TxPolicy(3, 1, 2.0, 900, "/sandbox", "server-default")


def header(**kw) -> TxHeader:
    base = dict(id=TX, principal="", agent_id="a", status=ACTIVE, policy=POLICY,
                created_at=1.0, updated_at=1.0)
    return TxHeader(**{**base, **kw})


def put_keys(plan) -> list[bytes]:
    return [op.key for op in plan.success if isinstance(op, Put)]


def kv(key: str) -> bytes:
    return KEYS.kv(key)


# ---- codec -----------------------------------------------------------------------------

def test_every_record_survives_its_codec():
    h = header(next_step_id=7, attempts=2, highest_step=9, replay_used=3, global_resets=1,
               constraints=("hint a", "hint b"), budget=Budget(1, 2, 3, 4, 5, 6, 7),
               quota_slot=42, fs_pending=FsPending(6, "abc", "r1", 5.0, "/s/f"),
               undoing=UndoIntent((6, 5), "r1", 4.0, False, True, 5, 1, 3))
    assert decode_header(encode_header(h)) == h
    entry = Touched(12, WriteState(Buffered(False, {"value": [1, {"a": None}]}, 22), 3, "both",
                                   b"/p/locks/fs/x"))
    assert decode_touched(encode_touched(entry)) == entry
    assert decode_touched(encode_touched(Touched(None))) == Touched(None)
    record = StepRecord(
        step_id=4, tool="fs.write", attempt="a1b2c3", output={"path": "f", "bytes": 3},
        refs=(1, 2), undo=(UndoImage(kv("k"), 0, WriteState()),
                           UndoImage(fs_id("f"), None, WriteState(None, 2, "put", b"/l"))),
        effect_keys=(b"/p/effkeys/-/k1",), effects=1,
        fs=FsWrite("f", "f", "/s/f", b"/p/locks/fs/%2Fs%2Ff", True, True, b"\x00\xffold",
                   "ab" * 32),
        saga={"ticket": 7}, has_saga=True, context_bytes=99, delta=Budget(1, 1, 10, 1, 5, 1, 99))
    assert decode_step(encode_step(record)) == record
    # the step's output as the step already encoded it is spliced in, not encoded again
    spliced = encode_step(record, b'{"path":"f","bytes":3}')
    assert decode_step(spliced) == record
    assert json.loads(spliced) == json.loads(encode_step(record))
    effect = StagedEffect("hooks", {"n": 1}, "key-1")
    assert decode_effect(encode_effect(effect)) == effect
    assert decode_context(encode_context("ticket.create", "line 1\nline 2 ✓")) == \
        ("ticket.create", "line 1\nline 2 ✓")
    assert decode_context(encode_context("a:b", "")) == ("a:b", "")


def test_the_header_stays_small_whatever_the_transaction_did():
    """Cost does not grow (docs/architecture.md#every-answer-fits-cost-does-not-grow):
    counters, not lists of steps or keys."""
    small = len(encode_header(header(next_step_id=2)))
    large = len(encode_header(header(next_step_id=100_000, highest_step=100_000,
                                     budget=Budget(900, 900, 10**9, 500, 10**8, 100, 10**6))))
    assert large - small < 64


def test_budgets_add_and_undo_keeps_the_read_set():
    total = Budget(1, 1, 10, 0, 0, 1, 50).plus(Budget(2, 1, 5, 1, 7, 0, 0))
    assert total == Budget(3, 2, 15, 1, 7, 1, 50)
    assert total.minus_undone(Budget(2, 1, 5, 1, 7, 0, 0)) == Budget(3, 1, 10, 0, 0, 1, 50)


# ---- a step ----------------------------------------------------------------------------

def test_a_step_compares_the_header_and_every_assumed_key_and_reads_them_back_on_failure():
    h = header(next_step_id=3)
    new = header(next_step_id=4)
    record = StepRecord(3, "kv.put", "n1", {"key": "k", "value": 1})
    entries = {kv("k"): Touched(0, WriteState(Buffered(False, {"value": 1}, 11), 3, "put"))}
    plan = step_plan(KEYS, h, 41, new, record, "why",
                     StepChanges(observed={kv("k"): 0}, entries=entries,
                                 assumed={kv("k"): 0, kv("seen"): 17}))
    assert plan.compares == [cmp_mod(KEYS.tx_header(TX), 41), cmp_mod(kv("k"), 0),
                             cmp_mod(kv("seen"), 17)]
    assert put_keys(plan) == [KEYS.tx_header(TX), KEYS.step(TX, 3), KEYS.context(TX, 3),
                              KEYS.touched(TX, kv("k"))]
    assert plan.failure == [Get(KEYS.tx_header(TX)), Get(kv("k")), Get(kv("seen"))]
    assert decode_header(plan.success[0].value) == new


def test_a_step_without_context_writes_no_context_key_and_takes_its_lock_and_reservations():
    h, new = header(next_step_id=1), header(next_step_id=2)
    lock, resv = b"/p/locks/fs/%2Fs%2Ff", KEYS.effect_key("", "k1")
    record = StepRecord(1, "fs.write", "n1", {"path": "f", "bytes": 1})
    plan = step_plan(KEYS, h, 5, new, record, "",
                     StepChanges(observed={}, entries={}, effects=[StagedEffect("log", 1, "k1")],
                                 reservations=[resv], lock_new=lock))
    assert KEYS.context(TX, 1) not in put_keys(plan)
    assert cmp_absent(resv) in plan.compares and cmp_absent(lock) in plan.compares
    assert KEYS.effect(TX, 1, 0) in put_keys(plan)
    assert Put(lock, TX.encode()) in plan.success
    held = step_plan(KEYS, h, 5, new, record, "",
                     StepChanges(observed={}, entries={}, lock_held=lock))
    assert cmp_value(lock, TX.encode()) in held.compares and lock not in put_keys(held)


def test_a_failed_step_records_only_what_it_read_for_the_first_time():
    known = {kv("old"): Touched(3)}
    observed = {kv("old"): 3, kv("new"): 0, fs_id("f"): 0}
    assert observation_entries(observed, known) == {kv("new"): Touched(0)}
    plan = step_plan(KEYS, header(), 9, header(attempts=1), None, "ignored",
                     StepChanges(observed=observed, entries=observation_entries(observed, known)))
    assert put_keys(plan) == [KEYS.tx_header(TX), KEYS.touched(TX, kv("new"))]
    assert cmp_mod(kv("new"), 0) in plan.compares


def test_step_entries_keep_the_first_observation_and_add_new_reads():
    before = {kv("w"): (5, WriteState())}
    states = {kv("w"): WriteState(Buffered(False, {"value": 2}, 11), 4, "put")}
    known = {kv("w"): Touched(5), kv("r"): None}
    out = step_entries(before, states, {kv("r"): 8}, known)
    assert out == {kv("w"): Touched(5, states[kv("w")]), kv("r"): Touched(8)}


# ---- rollback --------------------------------------------------------------------------

def _record(step: int, undo=(), **kw) -> StepRecord:
    return StepRecord(step, kw.pop("tool", "kv.put"), f"n{step}", None, undo=tuple(undo), **kw)


def test_undone_entries_return_each_key_to_its_state_before_the_earliest_undone_step():
    w2 = WriteState(Buffered(False, {"value": 2}, 11), 2, "put")
    done = [_record(4, [UndoImage(kv("k"), 0, w2)]),                     # newest first
            _record(3, [UndoImage(kv("k"), 0, WriteState()), UndoImage(kv("j"), 7, WriteState())])]
    assert undone_entries(done) == {kv("k"): Touched(0), kv("j"): Touched(7)}


def test_a_rollback_deletes_the_undone_suffix_in_four_range_deletes_and_releases_its_lock():
    lock = b"/p/locks/fs/x"
    fs = FsWrite("f", "f", "/s/f", lock, True, False, None, "00")
    done = [_record(5, effect_keys=(b"/p/effkeys/-/e",), effects=1),
            _record(4, tool="fs.write", fs=fs)]
    new = header(next_step_id=4)
    plan = rollback_plan(KEYS, header(next_step_id=6), 30, new, done)
    deletes = [op for op in plan.success if isinstance(op, Delete)]
    assert Delete(KEYS.step(TX, 4), b"/p/tx/" + TX.encode() + b"/step0") in deletes
    # steps, contexts, effects and gated calls from 4 on
    assert sum(1 for d in deletes if d.range_end) == 4
    assert Delete(KEYS.gate(TX, 4), b"/p/tx/" + TX.encode() + b"/gate0") in deletes
    assert Delete(b"/p/effkeys/-/e") in deletes and Delete(lock) in deletes
    assert cmp_value(lock, TX.encode()) in plan.compares
    assert decode_header(plan.success[0].value) == new


def test_an_abort_ends_everything_and_frees_the_quota_slot():
    h = header(quota_slot=12)
    plan = abort_plan(KEYS, h, 8, locks=[b"/l1", b"/l1"], reservations=[b"/r"])
    assert plan.compares == [cmp_mod(KEYS.tx_header(TX), 8)]
    assert Delete(KEYS.tx_header(TX)) in plan.success
    assert Delete(KEYS.tx_touch(TX)) in plan.success
    assert Delete(KEYS.open_slot("", 12)) in plan.success
    assert [op for op in plan.success if op == Delete(b"/l1")] == [Delete(b"/l1")]  # once
    assert Delete(b"/r") in plan.success


# ---- commit ----------------------------------------------------------------------------

def test_commit_compares_the_whole_read_set_and_applies_only_buffered_writes():
    entries = {
        kv("read-only"): Touched(11),                                          # a read
        kv("failed-read"): Touched(0),                                         # absent when read
        kv("put"): Touched(0, WriteState(Buffered(False, {"value": 1}, 11), 1, "put")),
        kv("gone"): Touched(9, WriteState(Buffered(True), 2, "delete")),
        fs_id("f"): Touched(None, WriteState(None, 3, "put", b"/p/locks/fs/f")),
    }
    effects = [StagedEffect("log", {"n": 1}, "k1")]
    outbox = [(KEYS.outbox(TX, 1), b"entry")]
    plan = commit_plan(KEYS, CommitSnapshot(header(quota_slot=3), 77, entries, effects, outbox),
                       reservation_lease=555)
    assert set(plan.compares) == {cmp_mod(KEYS.tx_header(TX), 77), cmp_mod(kv("read-only"), 11),
                                  cmp_mod(kv("failed-read"), 0), cmp_mod(kv("put"), 0),
                                  cmp_mod(kv("gone"), 9)}
    assert Put(kv("put"), json.dumps({"value": 1}, separators=(",", ":")).encode()) in plan.success
    assert Delete(kv("gone")) in plan.success
    assert not any(op.key == kv("read-only") for op in plan.success)
    assert Put(KEYS.outbox(TX, 1), b"entry") in plan.success
    resv = [op for op in plan.success if isinstance(op, Put) and op.key == KEYS.effect_key("", "k1")]
    assert len(resv) == 1 and resv[0].lease == 555
    assert Delete(b"/p/locks/fs/f") in plan.success
    assert Delete(KEYS.open_slot("", 3)) in plan.success
    assert plan.failure == [Get(KEYS.tx_header(TX))]


@pytest.mark.parametrize("n", [10, 500])
def test_commit_is_linear_in_what_the_transaction_touched(n):
    entries = {kv(f"k{i}"): Touched(0, WriteState(Buffered(False, {"value": i}, 11), i + 1, "put"))
               for i in range(n)}
    plan = commit_plan(KEYS, CommitSnapshot(header(next_step_id=n + 1), 1, entries, [], []))
    assert len(plan.compares) == n + 1
    assert len(plan.success) == n + 3  # n writes + tx prefix, header, touch


def test_fencing_an_unknown_step_rewrites_the_header_at_the_revision_the_lost_cas_compared():
    """The lost step CAS compared the header at revision 41: rewriting it there (the same
    record) means that CAS can never apply later; if the header moved, read it instead."""
    h = header(next_step_id=2)
    plan = fence_unknown_step_plan(KEYS, h, 41)
    hkey = KEYS.tx_header(TX)
    assert plan.compares == [cmp_mod(hkey, 41)]
    assert plan.success == [Put(hkey, encode_header(h))]
    assert plan.failure == [Get(hkey)]
