"""Engine v2 against two real replicas sharing one real etcd (SPEC §2): replica caches that
go stale never lose a step, the commit is serializable (write skew, failed-read races),
every answer fits what a default gRPC client accepts, and the reaper keeps working
however much data open transactions hold."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest

from agenttx.engine.state import from_json
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from support.rpc import KEYS, TIMEOUT_S, expect_error, expect_failure, get, output
from support.service import Agent, ServiceProcess
from support.waiting import eventually_async, slack

MIB = 1024 * 1024
ABORTED = grpc.StatusCode.ABORTED


def default_client(replica: ServiceProcess) -> pb_grpc.AgentTxServiceStub:
    """A stub with gRPC's default limits (4 MiB per response), like most clients."""
    return pb_grpc.AgentTxServiceStub(grpc.insecure_channel(replica.address))


# ---- caches that go stale ----------------------------------------------------------------

async def test_a_stale_replica_cache_never_loses_or_repeats_a_step(a, b, store, uniq):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"s1-{uniq}", "value": 1})                 # cached on a
    agent.ok("kv.put", {"key": f"s2-{uniq}", "value": "${steps.1.value}"}, stub=b)
    agent.ok("kv.put", {"key": f"s3-{uniq}", "value": 3}, stub=b)
    # a still remembers the transaction at step 2: it must not apply step 2 again ...
    expect_error(a.ExecuteStep, pb.ExecuteStepRequest(
        transaction_id=agent.tx, step_id=2, tool_name="kv.put",
        arguments_json=json.dumps({"key": f"again-{uniq}", "value": 0})),
        grpc.StatusCode.FAILED_PRECONDITION, "expects step 4")
    # ... and must run step 4 on what b wrote, reading b's output through a reference
    assert agent.ok("kv.get", {"key": f"s2-{uniq}"}) == {"key": f"s2-{uniq}", "value": 1}
    assert agent.ok("kv.put", {"key": f"s5-{uniq}", "value": "${steps.3.value}"}) == \
        {"key": f"s5-{uniq}", "value": 3}
    assert get(b, agent.tx).next_step_id == 6
    assert agent.commit().steps_committed == 5
    for key, value in ((f"s1-{uniq}", 1), (f"s2-{uniq}", 1), (f"s3-{uniq}", 3), (f"s5-{uniq}", 3)):
        assert from_json((await store.get(KEYS.kv(key))).value) == {"value": value}
    assert await store.get(KEYS.kv(f"again-{uniq}")) is None


def test_two_replicas_racing_on_one_step_have_exactly_one_winner_across_cache_states(a, b, uniq):
    for round_ in range(10):
        agent = Agent(a if round_ % 2 else b)
        agent.ok("kv.put", {"key": f"r{round_}-{uniq}", "value": 0})
        req = pb.ExecuteStepRequest(transaction_id=agent.tx, step_id=2, tool_name="kv.put",
                                    arguments_json=json.dumps({"key": f"w{round_}-{uniq}"}))
        outcomes = []
        futures = [stub.ExecuteStep.future(req, timeout=TIMEOUT_S) for stub in (a, b)]
        for f in futures:
            try:
                outcomes.append(f.result().status)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
                outcomes.append("lost")
        assert sorted(map(str, outcomes)) == sorted(map(str, [pb.STEP_STATUS_SUCCESS, "lost"]))
        assert get(a, agent.tx).next_step_id == 3


# ---- serializable commit -----------------------------------------------------------------

async def test_write_skew_commits_at_most_one_side(a, b, store, uniq):
    """T1 reads A and B and writes A; T2 reads A and B and writes B (SPEC §2)."""
    seed = Agent(a)
    seed.ok("kv.put", {"key": f"A-{uniq}", "value": 1})
    seed.ok("kv.put", {"key": f"B-{uniq}", "value": 1})
    assert seed.commit().committed
    t1, t2 = Agent(a), Agent(b)
    for t in (t1, t2):
        t.ok("kv.get", {"key": f"A-{uniq}"})
        t.ok("kv.get", {"key": f"B-{uniq}"})
    t1.ok("kv.put", {"key": f"A-{uniq}", "value": 0})
    t2.ok("kv.put", {"key": f"B-{uniq}", "value": 0})
    assert t1.commit().committed
    expect_error(b.CommitTransaction, pb.CommitTransactionRequest(transaction_id=t2.tx),
                 ABORTED, f'kv key "A-{uniq}"')
    assert from_json((await store.get(KEYS.kv(f"A-{uniq}"))).value) == {"value": 0}
    assert from_json((await store.get(KEYS.kv(f"B-{uniq}"))).value) == {"value": 1}


async def test_a_create_after_a_failed_read_conflicts_with_a_concurrent_creator(a, b, store, uniq):
    key = f"claim-{uniq}"
    t1 = Agent(a)
    expect_failure(t1.step("kv.get", {"key": key}), "no_data_found", key)
    t1.ok("kv.put", {"key": key, "value": "t1"})          # create-if-absent, as it saw it
    t2 = Agent(b)
    t2.ok("kv.put", {"key": key, "value": "t2"})
    assert t2.commit().committed
    expect_error(a.CommitTransaction, pb.CommitTransactionRequest(transaction_id=t1.tx),
                 ABORTED, f'kv key "{key}"')
    assert from_json((await store.get(KEYS.kv(key))).value) == {"value": "t2"}


async def test_a_failed_read_alone_is_validated_at_commit(a, b, store, uniq):
    """The error told the agent something: the read counts (SPEC §2)."""
    t1 = Agent(b)
    expect_failure(t1.step("record.get", {"table": f"t_{uniq}", "id": 1}), "no_data_found")
    t1.ok("kv.put", {"key": f"decided-{uniq}", "value": "no row, so..."})
    t2 = Agent(a)
    t2.ok("record.insert", {"table": f"t_{uniq}", "id": 1})
    assert t2.commit().committed
    expect_error(b.CommitTransaction, pb.CommitTransactionRequest(transaction_id=t1.tx),
                 ABORTED, f'row id=1 in table "t_{uniq}"')
    assert await store.get(KEYS.kv(f"decided-{uniq}")) is None


# ---- every answer fits -------------------------------------------------------------------

def test_64_steps_with_a_mib_of_raw_context_each_fail_before_the_log_outgrows_a_response(
        replicas, uniq):
    a, _ = replicas
    stub = default_client(a)
    agent = Agent(stub)
    context = "c" * (MIB - 64)
    refused = 0
    for i in range(64):
        resp = agent.step("kv.put", {"key": f"ctx-{uniq}-{i}", "value": i}, context=context)
        if resp.status != pb.STEP_STATUS_SUCCESS:
            hint = expect_failure(resp, "program_limit_exceeded")
            assert "context log" in hint or "raw_context" in hint, hint
            assert resp.strategy == pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK
            refused += 1
            output(agent.step("kv.put", {"key": f"ctx-{uniq}-{i}", "value": i},
                              context="short"))                # the agent keeps less
    assert refused == 61  # three MiB contexts fit one GetTransaction response, not four
    view = stub.GetTransaction(pb.GetTransactionRequest(transaction_id=agent.tx),
                               timeout=TIMEOUT_S)             # fits a default client
    assert [len(c.raw_context) for c in view.context[:4]] == [len(context)] * 3 + [5]
    assert len(view.context) == 64 and view.next_step_id == 65
    commit = stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=agent.tx),
                                    timeout=TIMEOUT_S)
    assert (commit.committed, commit.steps_committed) == (True, 64)


async def test_a_step_whose_output_would_not_fit_a_response_fails_and_changes_nothing(
        replicas, store, uniq):
    a, _ = replicas
    stub = default_client(a)
    agent = Agent(stub)
    big = "x" * (MIB - 100)
    output(agent.step("kv.put", {"key": f"big-{uniq}", "value": big}))
    before = get(stub, agent.tx)
    resp = agent.step("kv.put", {"key": f"huge-{uniq}", "value": ["${steps.1.value}"] * 4})
    hint = expect_failure(resp, "program_limit_exceeded")
    assert "ExecuteStep response" in hint, hint
    after = get(stub, agent.tx)
    assert (after.next_step_id, list(after.context)) == (before.next_step_id, list(before.context))
    assert agent.commit().steps_committed == 1
    assert await store.get(KEYS.kv(f"huge-{uniq}")) is None
    assert from_json((await store.get(KEYS.kv(f"big-{uniq}"))).value) == {"value": big}


# ---- the reaper reads headers only --------------------------------------------------------

@pytest.mark.timeout(240)
async def test_the_reaper_reaps_while_open_transactions_hold_over_100_mib(
        etcd, scratch, sandbox, store):
    prefix = f"/agenttx-bulk-{uuid.uuid4().hex[:8]}"
    # Long enough that all six stay open while the others are written, even on a busy
    # machine; every transaction is touched again once they all exist.
    idle_s = 30
    svc = ServiceProcess("bulk", etcd_endpoints=etcd.endpoints, prefix=prefix,
                         fs_root=str(sandbox), workdir=scratch / "bulk",
                         extra_args=["--tx-idle-timeout-s", str(idle_s)]).start()
    try:
        value = "v" * (MIB - 200)
        agents = []
        for t in range(6):
            agent = Agent(svc.stub, agent_id=f"bulk-{t}")
            for s in range(9):
                output(agent.step("kv.put", {"key": f"bulk-{t}-{s}", "value": value}))
            agents.append(agent)
        for agent in agents:
            assert get(svc.stub, agent.tx).next_step_id == 10  # open, and active again
        held = 0
        async for page in store.pages(f"{prefix}/tx/".encode(), page_size=8):
            held += sum(len(kv.value) for kv in page)
        assert held > 100 * MIB, held

        async def reaped_all() -> bool:
            return await store.count(f"{prefix}/txh/".encode()) == 0
        await eventually_async(reaped_all, slack(idle_s * 2),
                               "every idle transaction reaped")
        assert await store.count(f"{prefix}/tx/".encode()) == 0
        for agent in agents:
            expect_error(svc.stub.GetTransaction,
                         pb.GetTransactionRequest(transaction_id=agent.tx),
                         grpc.StatusCode.NOT_FOUND)
        reaped = [e for e in svc.logs() if e.get("msg") == "idle transaction expired"]
        assert len(reaped) == 6
    finally:
        svc.stop()
