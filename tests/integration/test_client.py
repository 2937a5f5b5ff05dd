"""`agenttx.client` (SPEC §10, §10.1) against the real service replicas and real etcd.

What a user of the client sees: a `with` block that commits when it ends normally and
aborts (files restored on disk) when it ends by an exception; failed steps as results
carrying category, hint and strategy; the step id tracked for them; typed errors whose
`.code` is the gRPC status; a commit conflict raising `Conflict` with the transaction
gone; a lost answer to a commit, or to a step that applied, reported as `OutcomeUnknown`,
never retried; a client given several replicas moving on when one dies.
"""

from __future__ import annotations

import uuid

import grpc
import pytest

from agenttx.client import (
    AgentTxError,
    Client,
    CommitResult,
    Conflict,
    ContextEntry,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    Policy,
    RollbackResult,
    StepStatus,
    Strategy,
    TransactionEnded,
    TransactionStatus,
    Unavailable,
)
from agenttx.embedded_etcd import free_port
from agenttx.testing import ServiceProcess


@pytest.fixture
def client(replicas):
    with Client(replicas[0].target) as c:
        yield c


@pytest.fixture
def client_b(replicas):
    with Client(replicas[1].target) as c:
        yield c


def _committed_value(client: Client, key: str):
    with client.transaction(agent_id="reader") as tx:
        r = tx.step("kv.get", {"key": key})
        tx.rollback()
    return r.output["value"] if r.ok else None


# ---- the transaction block ---------------------------------------------------------------

def test_leaving_the_block_normally_commits_and_the_transaction_is_gone(client, client_b, uniq):
    with client.transaction(agent_id=f"agent-{uniq}", metadata={"team": "billing"}) as tx:
        assert str(uuid.UUID(tx.id)) == tx.id and tx.next_step_id == 1
        first = tx.step("kv.put", {"key": f"k-{uniq}", "value": {"n": 1}}, context="stored n")
        assert (first.ok, first.status, first.step_id, first.output) == \
            (True, StepStatus.SUCCESS, 1, {"key": f"k-{uniq}", "value": {"n": 1}})
        assert (first.strategy, first.category, first.hint, first.next_step_id) == \
            (Strategy.NONE, "", "", 2)
        second = tx.step("record.insert", {"table": f"t_{uniq}", "id": 7,
                                           "fields": {"n": "${steps.1.value.n}"}})
        assert second.output == {"table": f"t_{uniq}", "id": 7, "fields": {"n": 1}}
        assert tx.next_step_id == 3
        state = tx.get()
        assert (state.transaction_id, state.status, state.next_step_id, state.agent_id) == \
            (tx.id, TransactionStatus.ACTIVE, 3, f"agent-{uniq}")
        assert state.context == (ContextEntry(1, "kv.put", "stored n"),)
        assert (state.constraints, state.global_resets, state.principal) == ((), 0, "")
    assert tx.finished
    assert _committed_value(client_b, f"k-{uniq}") == {"n": 1}
    with pytest.raises(NotFound) as err:
        client.get(tx.id)
    assert err.value.code == grpc.StatusCode.NOT_FOUND and tx.id in err.value.details


def test_an_exception_in_the_block_aborts_and_undoes_fs_writes_on_disk(client, client_b,
                                                                      sandbox, uniq):
    existing = sandbox / f"report-{uniq}.txt"
    existing.write_text("v1")
    created = sandbox / f"new-{uniq}" / "draft.txt"
    with pytest.raises(RuntimeError, match="the agent gave up"):
        with client.transaction(agent_id="fs-agent") as tx:
            assert tx.step("fs.write", {"path": existing.name, "contents": "v2"}).ok
            assert tx.step("fs.write", {"path": f"new-{uniq}/draft.txt", "contents": "x"}).ok
            assert tx.step("kv.put", {"key": f"never-{uniq}", "value": 1}).ok
            assert existing.read_text() == "v2" and created.read_text() == "x"
            raise RuntimeError("the agent gave up")
    assert existing.read_text() == "v1"
    assert not created.exists()
    assert tx.finished
    with pytest.raises(NotFound):
        tx.get()
    assert _committed_value(client_b, f"never-{uniq}") is None


def test_an_abort_that_cannot_undo_keeps_the_exception_and_says_why(client, sandbox, uniq):
    target = sandbox / f"blocker-{uniq}"
    with pytest.raises(KeyError) as raised:
        with client.transaction() as tx:
            assert tx.step("fs.write", {"path": target.name, "contents": "created"}).ok
            target.unlink()
            target.mkdir()
            (target / "inside.txt").write_text("x")  # the undo cannot delete a full directory
            raise KeyError("boom")
    notes = raised.value.__notes__
    assert len(notes) == 1 and tx.id in notes[0] and target.name in notes[0]
    assert client.get(tx.id).status == TransactionStatus.AWAITING_ROLLBACK
    assert not tx.finished
    for child in target.iterdir():
        child.unlink()
    target.rmdir()
    assert tx.rollback() == RollbackResult(True, 0, 1, ())
    assert tx.finished


def test_a_failed_step_is_a_result_with_hint_strategy_and_the_next_step(client, uniq):
    with client.transaction(policy=Policy(max_local_depth=1)) as tx:
        assert tx.step("kv.put", {"key": f"who-{uniq}", "value": f"c-{uniq}"}).ok
        r = tx.step("record.insert", {"table": "orders", "id": f"o-{uniq}",
                                      "fields": {"customer_id": "${steps.1.value}"},
                                      "references": {"customer_id": f"customers_{uniq}"}})
        assert (r.ok, r.status, r.output, r.output_json) == \
            (False, StepStatus.ROLLBACK_TRIGGERED, None, "")
        assert r.category == "foreign_key_violation" and f"c-{uniq}" in r.hint
        # the bad value came from step 1 through a reference: jump back to it
        assert (r.strategy, r.rollback_to_step, r.next_step_id) == (Strategy.DEPENDENCY_JUMP, 1, 1)
        assert r.strategy == "DEPENDENCY_JUMP" and isinstance(r.strategy, str)
        assert r.constraints == (r.hint,) and r.rollback_latency_ms >= 0.0
        assert (r.context_reset, r.abort_reason, r.compensation_errors, r.ended) == \
            (False, "", (), False)
        assert tx.next_step_id == 1  # tracked: the next step() sends step 1 again
        again = tx.step("kv.get", {"key": f"missing-{uniq}"})
        assert (again.step_id, again.strategy, again.next_step_id) == \
            (1, Strategy.LOCAL_BACKTRACK, 1)
        assert tx.get().constraints == (r.hint, again.hint)
        tx.rollback()


def test_an_abort_strategy_ends_the_transaction_and_leaving_the_block_says_so(client, uniq):
    with pytest.raises(TransactionEnded) as left:
        with client.transaction(policy={"max_local_depth": 0, "max_global_resets": 0}) as tx:
            assert tx.step("kv.put", {"key": f"gone-{uniq}", "value": 1}).ok
            r = tx.step("kv.gett", {})
            assert (r.ok, r.status, r.strategy, r.next_step_id, r.ended, r.context_reset) == \
                (False, StepStatus.FAILED, Strategy.ABORT, 0, True, True)
            assert r.category == "undefined_function" and r.abort_reason
            assert tx.finished
            with pytest.raises(TransactionEnded) as ended:
                tx.step("kv.put", {"key": "x"})
            assert ended.value.code == grpc.StatusCode.NOT_FOUND
            assert ended.value.history is None  # raised locally, without a call
    assert left.value.history is not None and left.value.history.reason == r.abort_reason
    with pytest.raises(NotFound):
        client.get(tx.id)
    assert _committed_value(client, f"gone-{uniq}") is None


def test_after_an_explicit_commit_or_rollback_leaving_the_block_does_nothing_more(client, uniq):
    with client.transaction() as tx:
        assert tx.step("kv.put", {"key": f"c-{uniq}", "value": 1}).ok
        assert tx.commit() == CommitResult(True, 1, 0, (), False, "")
    with client.transaction() as tx:
        assert tx.step("kv.put", {"key": f"r-{uniq}", "value": 1}).ok
        assert tx.rollback(reason="changed my mind") == RollbackResult(True, 0, 1, ())
    assert _committed_value(client, f"c-{uniq}") == 1
    assert _committed_value(client, f"r-{uniq}") is None


def test_rollback_to_a_step_rewinds_and_the_block_still_commits(client, uniq):
    with client.transaction() as tx:
        for i in (1, 2, 3):
            assert tx.step("kv.put", {"key": f"s{i}-{uniq}", "value": i}).ok
        assert tx.rollback(to_step=2) == RollbackResult(True, 2, 2, ())
        assert (tx.next_step_id, tx.finished) == (2, False)
        r = tx.step("kv.put", {"key": f"again-{uniq}", "value": 2})
        assert (r.step_id, r.next_step_id) == (2, 3)
    assert [_committed_value(client, f"{k}-{uniq}") for k in ("s1", "s2", "s3", "again")] == \
        [1, None, None, 2]


def test_attach_continues_a_transaction_from_another_client(client, client_b, uniq):
    tx = client.begin(agent_id="first-half")
    assert tx.step("kv.put", {"key": f"half-{uniq}", "value": 1}).ok
    resumed = client_b.attach(tx.id)
    assert resumed.next_step_id == 2
    assert resumed.step("kv.get", {"key": f"half-{uniq}"}).output["value"] == 1
    assert resumed.commit().steps_committed == 2


# ---- errors ------------------------------------------------------------------------------

def test_a_commit_conflict_raises_conflict_and_the_transaction_is_gone(client, client_b,
                                                                      sandbox, uniq):
    file = sandbox / f"conflict-{uniq}.txt"
    with client.transaction() as seed:
        seed.step("kv.put", {"key": f"shared-{uniq}", "value": 0})
    loser = client.begin()
    assert loser.step("kv.get", {"key": f"shared-{uniq}"}).ok
    assert loser.step("kv.put", {"key": f"shared-{uniq}", "value": "loser"}).ok
    assert loser.step("fs.write", {"path": file.name, "contents": "by the loser"}).ok
    with client_b.transaction() as winner:
        winner.step("kv.put", {"key": f"shared-{uniq}", "value": "winner"})
    with pytest.raises(Conflict) as err:
        with loser:
            pass  # leaving the block commits, and the commit loses the race
    assert err.value.code == grpc.StatusCode.ABORTED
    assert f"shared-{uniq}" in err.value.details and isinstance(err.value, AgentTxError)
    assert loser.finished and not file.exists()  # compensated: the fs write is undone
    with pytest.raises(NotFound):
        loser.get()
    with pytest.raises(NotFound):
        loser.commit()
    assert _committed_value(client, f"shared-{uniq}") == "winner"


def test_rpc_errors_are_typed_and_carry_the_status_code(client, client_b, sandbox, uniq):
    with pytest.raises(NotFound) as nf:
        client.get(str(uuid.uuid4()))
    assert nf.value.code == grpc.StatusCode.NOT_FOUND and "not found" in nf.value.details
    with pytest.raises(InvalidArgument) as bad:
        client.begin(policy=Policy(max_local_depth=17))
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT and "max_local_depth" in bad.value.details
    with pytest.raises(InvalidArgument):
        client.begin(agent_id="x" * 300)
    # a transaction waiting for a manual rollback refuses steps and commit
    tx = client.begin()
    tx.step("fs.write", {"path": f"stuck-{uniq}", "contents": "x"})
    (sandbox / f"stuck-{uniq}").unlink()
    (sandbox / f"stuck-{uniq}").mkdir()
    (sandbox / f"stuck-{uniq}" / "f").write_text("x")
    assert tx.rollback(to_step=1).rolled_back is False
    with pytest.raises(FailedPrecondition) as fp:
        tx.step("kv.put", {"key": "x"})
    assert fp.value.code == grpc.StatusCode.FAILED_PRECONDITION and "rollback" in fp.value.details
    with pytest.raises(FailedPrecondition):
        tx.commit()
    (sandbox / f"stuck-{uniq}" / "f").unlink()
    (sandbox / f"stuck-{uniq}").rmdir()
    assert client_b.rollback(tx.id).rolled_back


def test_an_unreachable_service_is_unavailable(scratch):
    with Client(f"127.0.0.1:{free_port()}", timeout=5) as dead:
        with pytest.raises(Unavailable) as err:
            dead.begin()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(Unavailable):  # a read, retried with backoff, then given up
            dead.get(str(uuid.uuid4()))


# ---- lost answers are never retried ------------------------------------------------------

@pytest.fixture(scope="module")
def slow_service(etcd, scratch, sandbox):
    """A replica that pauses 2 s after renaming an fs.write and after a commit applied."""
    svc = ServiceProcess("client-slow", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-slow-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                         workdir=scratch / "client-slow",
                         env={"AGENTTX_FAILPOINTS": "fs.write.after_rename=sleep(2),"
                                                    "commit.after_txn=sleep(2)"}).start()
    yield svc
    svc.stop()


def test_a_step_whose_answer_is_lost_raises_outcome_unknown_with_the_reread(slow_service,
                                                                           sandbox, uniq):
    with Client(slow_service.target) as client:
        tx = client.begin()
        assert tx.step("kv.put", {"key": f"a-{uniq}", "value": 1}).ok
        with pytest.raises(OutcomeUnknown) as err:
            tx.step("fs.write", {"path": f"slow-{uniq}.txt", "contents": "x"}, timeout=0.5)
        e = err.value
        assert (e.code, e.rpc, e.step_id, e.ended, e.reread_error) == \
            (grpc.StatusCode.DEADLINE_EXCEEDED, "ExecuteStep", 2, False, None)
        assert e.state is not None and e.state.next_step_id == 3
        assert "not retried" in e.details and "the step applied" in e.details
        assert (sandbox / f"slow-{uniq}.txt").read_text() == "x"
        assert tx.next_step_id == 3  # taken from the re-read
        assert tx.step("kv.get", {"key": f"a-{uniq}"}).step_id == 3
        tx.rollback()


def test_a_commit_whose_answer_is_lost_raises_outcome_unknown(slow_service, uniq):
    with Client(slow_service.target) as client:
        tx = client.begin()
        assert tx.step("kv.put", {"key": f"lost-{uniq}", "value": "kept"}).ok
        with pytest.raises(OutcomeUnknown) as err:
            tx.commit(timeout=0.5)
        assert (err.value.rpc, err.value.ended, err.value.state) == ("CommitTransaction", True, None)
        assert "the commit applied" in err.value.details
        assert tx.finished
        assert _committed_value(client, f"lost-{uniq}") == "kept"


def test_a_commit_on_a_replica_that_dies_reports_the_failed_reread(etcd, scratch, sandbox, uniq):
    svc = ServiceProcess("client-crash", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-crash-{uniq}", fs_root=str(sandbox),
                         workdir=scratch / "client-crash",
                         env={"AGENTTX_FAILPOINTS": "commit.after_txn=crash"}).start()
    try:
        with Client(svc.target, timeout=10) as client:
            tx = client.begin()
            tx.step("kv.put", {"key": f"crash-{uniq}", "value": 1})
            with pytest.raises(OutcomeUnknown) as err:
                tx.commit()
        e = err.value
        assert e.code == grpc.StatusCode.UNAVAILABLE and e.state is None and not e.ended
        assert isinstance(e.reread_error, Unavailable)
        assert "the re-read failed too" in e.details
        assert not tx.finished
    finally:
        svc.stop()


# ---- several replicas: the client moves on when one dies -----------------------------------

def test_a_client_given_both_replicas_carries_a_transaction_across_their_deaths(
        etcd, scratch, sandbox, uniq):
    prefix = f"/agenttx-pair-{uniq}"
    a, b = (ServiceProcess(f"client-pair-{n}", etcd_endpoints=etcd.endpoints, prefix=prefix,
                           fs_root=str(sandbox), workdir=scratch / f"client-pair-{n}-{uniq}")
            for n in "ab")
    with a.start(), b.start(), Client([a.target, b.target], timeout=10) as client:
        tx = client.begin()
        assert tx.step("kv.put", {"key": f"pair-{uniq}", "value": 1}).ok
        assert client.target == a.target
        a.kill()
        # the call to the dead replica fails; the client re-reads on b, sees step 2 did not
        # apply, and re-sends it there: the agent sees one successful step
        r = tx.step("kv.put", {"key": f"pair-{uniq}", "value": 2})
        assert (r.ok, r.step_id, r.next_step_id) == (True, 2, 3)
        assert (client.target, client.resent_steps) == (b.target, 1)
        a.start()
        b.kill()
        r = tx.step("fs.write", {"path": f"pair-{uniq}.txt", "contents": "both"})
        assert (r.ok, r.step_id, client.target, client.resent_steps) == (True, 3, a.target, 2)
        assert tx.get().next_step_id == 4  # every step applied exactly once
        assert tx.commit().steps_committed == 3
        assert _committed_value(client, f"pair-{uniq}") == 2
        assert (sandbox / f"pair-{uniq}.txt").read_text() == "both"


def test_a_closed_client_refuses_calls_without_reopening(replicas):
    client = Client([replicas[0].target, replicas[1].target])
    client.close()
    with pytest.raises(ValueError, match="Client is closed"):
        client.begin()


def test_a_target_list_must_name_a_replica():
    for bad in ([], [""], ["127.0.0.1:1", " "]):
        with pytest.raises(ValueError, match="non-empty list"):
            Client(bad)


# ---- listing -----------------------------------------------------------------------------

def test_list_transactions_pages_filters_and_skips_ended_ones(client, client_b, sandbox, uniq):
    prefix = f"list-{uniq}-"
    txs = [client.begin(agent_id=f"{prefix}{i}") for i in range(5)]
    txs[0].step("kv.put", {"key": f"l-{uniq}", "value": 1})
    txs[4].commit()  # ended: never listed
    listed = {t.transaction_id: t for t in client_b.list_transactions(agent_id_prefix=prefix,
                                                                      page_size=2)}
    assert set(listed) == {t.id for t in txs[:4]}
    row = listed[txs[0].id]
    assert (row.status, row.agent_id, row.principal, row.next_step_id) == \
        (TransactionStatus.ACTIVE, f"{prefix}0", "", 2)
    assert row.created_at > 0 and row.updated_at >= row.created_at
    page = client_b.list_page(page_size=2, agent_id_prefix=prefix)
    assert len(page.transactions) == 2 and page.next_page_token
    rest = client_b.list_page(page_size=1000, page_token=page.next_page_token,
                              agent_id_prefix=prefix)
    assert {t.transaction_id for t in page.transactions + rest.transactions} == set(listed)
    assert rest.next_page_token == ""
    # status filter: one transaction waiting for a manual rollback
    stuck = txs[1]
    stuck.step("fs.write", {"path": f"list-{uniq}", "contents": "x"})
    (sandbox / f"list-{uniq}").unlink()
    (sandbox / f"list-{uniq}").mkdir()
    (sandbox / f"list-{uniq}" / "f").write_text("x")
    assert not stuck.rollback(to_step=1).rolled_back
    waiting = list(client_b.list_transactions(status="AWAITING_ROLLBACK", agent_id_prefix=prefix))
    assert [t.transaction_id for t in waiting] == [stuck.id]
    assert waiting[0].status == TransactionStatus.AWAITING_ROLLBACK
    assert list(client_b.list_transactions(status=TransactionStatus.COMMITTED,
                                           agent_id_prefix=prefix)) == []
    with pytest.raises(InvalidArgument, match="page_token"):
        client_b.list_page(page_token="not base64!")
    (sandbox / f"list-{uniq}" / "f").unlink()
    (sandbox / f"list-{uniq}").rmdir()
    for t in txs[:4]:
        assert t.rollback().rolled_back
    assert list(client_b.list_transactions(agent_id_prefix=prefix)) == []
