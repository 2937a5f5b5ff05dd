"""RollbackTransaction (docs/api.md#rollbacktransaction): `to_step = k` undoes the live steps
>= k in reverse order (fs: previous bytes restored or the file deleted; kv/record: buffered writes dropped;
effects: discarded, never delivered), reports compensations_run and next_step_id = k;
unset or 0 aborts the transaction (NOT_FOUND afterwards, files restored)."""

from __future__ import annotations

import shutil

import grpc
import pytest

from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import KEYS, expect_error, expect_failure, get
from support.service import Agent


def _delivered(replicas, key: str) -> int:
    return sum(1 for p in replicas for r in p.logs()
               if r.get("msg") == "effect" and r.get("idempotency_key") == key)


async def test_rollback_to_step_undoes_later_steps_and_discards_their_effects(
        a, b, store, sandbox, replicas, uniq):
    existing = sandbox / f"doc-{uniq}.txt"
    existing.write_text("v1")
    created = sandbox / f"made-{uniq}/new.txt"
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"kept-{uniq}", "value": "kept"}, context="one")       # 1
    agent.ok("effect.stage", {"channel": "log", "idempotency_key": f"kept-{uniq}"})     # 2
    agent.ok("fs.write", {"path": f"made-{uniq}/new.txt", "contents": "fresh"})         # 3
    agent.ok("kv.put", {"key": f"undone-{uniq}", "value": 1}, context="four")          # 4
    agent.ok("record.insert", {"table": f"t_{uniq}", "id": 1})                        # 5
    agent.ok("effect.stage", {"channel": "log", "idempotency_key": f"undone-{uniq}"})   # 6
    agent.ok("fs.write", {"path": f"doc-{uniq}.txt", "contents": "v2"})                # 7
    assert existing.read_text() == "v2" and created.read_text() == "fresh"

    resp = b.RollbackTransaction(pb.RollbackTransactionRequest(
        transaction_id=agent.tx, to_step=3, reason="test"), timeout=30)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run,
            list(resp.compensation_errors)) == (True, 3, 5, [])
    agent.next = resp.next_step_id
    assert existing.read_text() == "v1"  # previous bytes restored
    assert not created.exists()          # created file deleted
    assert [p.name for p in sandbox.iterdir() if uniq in p.name and ".agenttx-" in p.name] == []
    assert len(await store.get_prefix(KEYS.steps_prefix(agent.tx))) == 2
    view = get(a, agent.tx)
    assert (view.status, view.next_step_id) == (pb.TRANSACTION_STATUS_ACTIVE, 3)
    assert [(c.step_id, c.raw_context) for c in view.context] == [(1, "one")]

    # buffered kv/record writes are gone; earlier steps are intact
    expect_failure(agent.step("kv.get", {"key": f"undone-{uniq}"}), "no_data_found")
    expect_failure(agent.step("record.get", {"table": f"t_{uniq}", "id": 1}), "no_data_found")
    assert agent.ok("kv.get", {"key": f"kept-{uniq}"})["value"] == "kept"
    # the undone steps' locks are released: another transaction can write the file
    other = Agent(b)
    other.ok("fs.write", {"path": f"doc-{uniq}.txt", "contents": "other"})
    assert other.rollback().rolled_back
    assert existing.read_text() == "v1"

    commit = agent.commit()
    assert (commit.committed, commit.steps_committed, commit.effects_dispatched) == (True, 3, 1)
    assert _delivered(replicas, f"kept-{uniq}") == 1
    assert _delivered(replicas, f"undone-{uniq}") == 0
    assert await store.get(KEYS.kv(f"undone-{uniq}")) is None
    assert await store.get(KEYS.record(f"t_{uniq}", 1)) is None
    assert await store.get(KEYS.kv(f"kept-{uniq}")) is not None




def test_rollback_undoes_writes_to_one_file_in_reverse_order(a, sandbox, uniq):
    path = sandbox / f"order-{uniq}.txt"
    path.write_text("v1")
    agent = Agent(a)
    agent.ok("fs.write", {"path": path.name, "contents": "v2"})
    agent.ok("fs.write", {"path": path.name, "contents": "v3"})
    resp = agent.rollback(to_step=1)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 1, 2)
    # reverse order: step 2 restores "v2", then step 1 restores "v1" (forward order: "v2")
    assert path.read_text() == "v1"


def test_rollback_to_step_one_undoes_everything_but_keeps_the_transaction(a, sandbox, uniq):
    agent = Agent(a)
    agent.ok("fs.write", {"path": f"one-{uniq}.txt", "contents": "x"})
    agent.ok("kv.put", {"key": f"k-{uniq}"})
    resp = agent.rollback(to_step=1)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 1, 2)
    assert not (sandbox / f"one-{uniq}.txt").exists()
    assert get(a, agent.tx).next_step_id == 1
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": "again"})
    assert agent.commit().steps_committed == 1


def test_rollback_to_the_last_step_undoes_only_it(a, uniq):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"a-{uniq}"})
    agent.ok("kv.put", {"key": f"b-{uniq}"})
    resp = agent.rollback(to_step=2)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 2, 1)
    resp = agent.rollback(to_step=1)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 1, 1)


@pytest.mark.parametrize("to_step", [None, 0])
async def test_rollback_without_to_step_aborts_and_restores_files(
        a, b, store, sandbox, replicas, uniq, to_step):
    existing = sandbox / f"abort-{uniq}.txt"
    existing.write_bytes(b"\x00binary\xffprevious")
    agent = Agent(a)
    agent.ok("fs.write", {"path": f"abort-{uniq}.txt", "contents": "replaced"})
    agent.ok("fs.write", {"path": f"abort-new-{uniq}.txt", "contents": "created"})
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1})
    agent.ok("effect.stage", {"channel": "log", "idempotency_key": f"abort-{uniq}"})
    req = pb.RollbackTransactionRequest(transaction_id=agent.tx, reason="give up")
    if to_step is not None:
        req.to_step = to_step
    resp = b.RollbackTransaction(req, timeout=30)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run,
            list(resp.compensation_errors)) == (True, 0, 4, [])
    assert existing.read_bytes() == b"\x00binary\xffprevious"
    assert not (sandbox / f"abort-new-{uniq}.txt").exists()
    assert await store.get_prefix(KEYS.tx_prefix(agent.tx)) == []
    assert await store.get(KEYS.kv(f"k-{uniq}")) is None
    for stub in (a, b):
        expect_error(stub.GetTransaction, pb.GetTransactionRequest(transaction_id=agent.tx),
                     grpc.StatusCode.NOT_FOUND, agent.tx)
        expect_error(stub.CommitTransaction, pb.CommitTransactionRequest(transaction_id=agent.tx),
                     grpc.StatusCode.NOT_FOUND, agent.tx)
    assert _delivered(replicas, f"abort-{uniq}") == 0
    # the locks were released
    Agent(b).ok("fs.write", {"path": f"abort-{uniq}.txt", "contents": "next"})


def test_rollback_of_an_empty_transaction(a):
    agent = Agent(a)
    resp = agent.rollback(to_step=0)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 0, 0)


def test_a_failed_undo_leaves_the_transaction_waiting_for_a_manual_rollback(a, b, sandbox, uniq):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"k-{uniq}"})
    agent.ok("fs.write", {"path": f"blocker-{uniq}", "contents": "created by the step"})
    # someone replaces the created file with a non-empty directory: the undo cannot delete it
    target = sandbox / f"blocker-{uniq}"
    target.unlink()
    target.mkdir()
    (target / "inside.txt").write_text("x")
    resp = agent.rollback(to_step=1)
    assert resp.rolled_back is False
    assert resp.compensations_run == 0
    assert len(resp.compensation_errors) == 1 and f"blocker-{uniq}" in resp.compensation_errors[0]
    assert resp.next_step_id == 3
    view = get(b, agent.tx)
    assert view.status == pb.TRANSACTION_STATUS_AWAITING_ROLLBACK
    # not active: steps and commit are refused until a rollback succeeds
    expect_error(b.ExecuteStep, pb.ExecuteStepRequest(
        transaction_id=agent.tx, step_id=view.next_step_id, tool_name="kv.put",
        arguments_json='{"key": "x"}'), grpc.StatusCode.FAILED_PRECONDITION, "rollback")
    expect_error(a.CommitTransaction, pb.CommitTransactionRequest(transaction_id=agent.tx),
                 grpc.StatusCode.FAILED_PRECONDITION, "rollback")
    # fix the obstacle and retry: the rollback resumes where it stopped
    shutil.rmtree(target)
    resp = agent.rollback(to_step=1)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run,
            list(resp.compensation_errors)) == (True, 1, 2, [])
    assert not target.exists()
    assert get(a, agent.tx).status == pb.TRANSACTION_STATUS_ACTIVE
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": "after"})
    assert agent.commit().steps_committed == 1
