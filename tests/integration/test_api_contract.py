"""SPEC §1 against two real replicas: every RPC, every validation rule, every status code.

Validation failures are INVALID_ARGUMENT and change nothing (checked by reading the
transaction back and by counting keys in etcd); ended or unknown transactions are
NOT_FOUND on every RPC; wrong step order is FAILED_PRECONDITION. No call ever answers
UNKNOWN (expect_error pins the exact code of each).
"""

from __future__ import annotations

import json
import math
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import KEYS, TIMEOUT_S, expect_error, expect_failure, get, output
from support.service import Agent

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
MIB = 1024 * 1024


async def _headers(store) -> int:
    return len(await store.get_prefix(KEYS.headers_prefix()))


async def _step_keys(store, tx: str) -> list[bytes]:
    return [kv.key for kv in await store.get_prefix(KEYS.steps_prefix(tx))]


# ---- the happy path of every RPC -----------------------------------------------------

def test_begin_returns_a_uuid4_and_step_one(a, b):
    first = a.BeginTransaction(pb.BeginTransactionRequest(agent_id="x"), timeout=TIMEOUT_S)
    second = b.BeginTransaction(pb.BeginTransactionRequest(), timeout=TIMEOUT_S)
    for resp in (first, second):
        assert str(uuid.UUID(resp.transaction_id)) == resp.transaction_id
        assert uuid.UUID(resp.transaction_id).version == 4
        assert resp.next_step_id == 1
    assert first.transaction_id != second.transaction_id


def test_every_rpc_works_across_both_replicas(a, b, uniq):
    agent = Agent(a, agent_id=f"agent-{uniq}")
    assert agent.ok("kv.put", {"key": f"k1-{uniq}", "value": 1}, stub=b) == \
        {"key": f"k1-{uniq}", "value": 1}
    assert agent.ok("kv.put", {"key": f"k2-{uniq}", "value": 2}) == {"key": f"k2-{uniq}", "value": 2}
    view = get(b, agent.tx)
    assert (view.transaction_id, view.next_step_id) == (agent.tx, 3)
    rb = b.RollbackTransaction(pb.RollbackTransactionRequest(
        transaction_id=agent.tx, to_step=2, reason="changed my mind"), timeout=TIMEOUT_S)
    assert (rb.rolled_back, rb.next_step_id, rb.compensations_run, list(rb.compensation_errors)) \
        == (True, 2, 1, [])
    agent.next = rb.next_step_id
    commit = a.CommitTransaction(pb.CommitTransactionRequest(transaction_id=agent.tx),
                                 timeout=TIMEOUT_S)
    assert (commit.committed, commit.steps_committed, commit.effects_dispatched,
            list(commit.dispatch_errors)) == (True, 1, 0, [])
    reader = Agent(b)
    assert reader.ok("kv.get", {"key": f"k1-{uniq}"})["value"] == 1
    expect_failure(reader.step("kv.get", {"key": f"k2-{uniq}"}), "no_data_found", f"k2-{uniq}")


@pytest.mark.parametrize("service", ["", "agenttx.v1.AgentTxService"])
def test_health_service_reports_serving_on_both_replicas(replicas, service):
    for replica in replicas:
        stub = health_pb2_grpc.HealthStub(replica.channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_service_answers_not_found_for_an_unknown_service(a, replicas):
    stub = health_pb2_grpc.HealthStub(replicas[0].channel)
    expect_error(stub.Check, health_pb2.HealthCheckRequest(service="no.such.Service"), NOT_FOUND)


# ---- BeginTransaction validation -----------------------------------------------------

@pytest.mark.parametrize("agent_id", [
    "a" * 257,
    "é" * 128 + "a",      # 129 characters, 257 bytes
    "€" * 86,             # 86 characters, 258 bytes
], ids=["ascii-257", "two-byte-257", "three-byte-258"])
async def test_begin_rejects_agent_id_over_256_bytes(a, store, agent_id):
    before = await _headers(store)
    expect_error(a.BeginTransaction, pb.BeginTransactionRequest(agent_id=agent_id), INVALID,
                 "agent_id", "256")
    assert await _headers(store) == before


@pytest.mark.parametrize("agent_id", ["a" * 256, "é" * 128, "€" * 85 + "a"],
                         ids=["ascii-256", "two-byte-256", "three-byte-256"])
def test_begin_accepts_agent_id_of_256_bytes_and_returns_it(a, agent_id):
    resp = a.BeginTransaction(pb.BeginTransactionRequest(agent_id=agent_id), timeout=TIMEOUT_S)
    assert get(a, resp.transaction_id).agent_id == agent_id


async def test_begin_rejects_65_metadata_entries_and_accepts_64(a, store):
    before = await _headers(store)
    too_many = {f"k{i}": "v" for i in range(65)}
    expect_error(a.BeginTransaction, pb.BeginTransactionRequest(metadata=too_many), INVALID,
                 "metadata", "64")
    assert await _headers(store) == before
    resp = a.BeginTransaction(pb.BeginTransactionRequest(
        metadata={f"k{i}": "v" for i in range(64)}), timeout=TIMEOUT_S)
    assert resp.next_step_id == 1


@pytest.mark.parametrize(("field", "value"), [
    ("max_local_depth", 17),
    ("max_local_depth", 2**32 - 1),
    ("max_global_resets", 17),
    ("max_global_resets", 1000),
    ("replay_budget_factor", math.nan),
    ("replay_budget_factor", math.inf),
    ("replay_budget_factor", -math.inf),
    ("replay_budget_factor", 0.09),
    ("replay_budget_factor", 0.0),
    ("replay_budget_factor", -1.0),
    ("replay_budget_factor", 1000.1),
])
async def test_begin_rejects_a_policy_field_out_of_range(a, store, field, value):
    before = await _headers(store)
    req = pb.BeginTransactionRequest(agent_id="p", policy=pb.RollbackPolicy(**{field: value}))
    expect_error(a.BeginTransaction, req, INVALID, f"policy.{field}")
    assert await _headers(store) == before


@pytest.mark.parametrize(("field", "value"), [
    ("max_local_depth", 0), ("max_local_depth", 16),
    ("max_global_resets", 0), ("max_global_resets", 16),
    ("replay_budget_factor", 0.1), ("replay_budget_factor", 1000.0),
])
def test_begin_accepts_policy_bounds(a, field, value):
    resp = a.BeginTransaction(pb.BeginTransactionRequest(policy=pb.RollbackPolicy(**{field: value})),
                              timeout=TIMEOUT_S)
    assert resp.next_step_id == 1
    assert get(a, resp.transaction_id).status == pb.TRANSACTION_STATUS_ACTIVE


# ---- transaction_id on every RPC -----------------------------------------------------

def _requests_without_tx() -> dict[str, tuple[str, object]]:
    return {
        "ExecuteStep": ("ExecuteStep", pb.ExecuteStepRequest(
            step_id=1, tool_name="kv.put", arguments_json='{"key": "k"}')),
        "CommitTransaction": ("CommitTransaction", pb.CommitTransactionRequest()),
        "RollbackTransaction": ("RollbackTransaction", pb.RollbackTransactionRequest(to_step=1)),
        "RollbackTransaction-abort": ("RollbackTransaction", pb.RollbackTransactionRequest()),
        "GetTransaction": ("GetTransaction", pb.GetTransactionRequest()),
        "DecideApproval": ("DecideApproval", pb.DecideApprovalRequest(
            approve=False, reason="no")),
    }


@pytest.mark.parametrize("which", list(_requests_without_tx()))
def test_every_rpc_requires_transaction_id(a, b, which):
    method, request = _requests_without_tx()[which]
    for stub in (a, b):
        expect_error(getattr(stub, method), request, INVALID, "transaction_id")


# ---- ExecuteStep validation: INVALID_ARGUMENT and nothing changed ----------------------

def _bad_step(kind: str, tx: str, next_step: int) -> pb.ExecuteStepRequest:
    req = pb.ExecuteStepRequest(transaction_id=tx, step_id=next_step, tool_name="kv.put",
                                arguments_json='{"key": "bad", "value": 1}')
    if kind == "step_id-0":
        req.step_id = 0
    elif kind == "tool_name-empty":
        req.tool_name = ""
    elif kind == "tool_name-129-bytes":
        req.tool_name = "a" * 129
    elif kind == "tool_name-129-bytes-multibyte":
        req.tool_name = "é" * 64 + "a"  # 65 characters
    elif kind == "arguments_json-over-1MiB":
        req.arguments_json = '{"key": "bad", "value": "' + "x" * MIB + '"}'
    elif kind == "arguments_json-over-1MiB-multibyte":
        req.arguments_json = '{"key": "bad", "value": "' + "é" * (MIB // 2) + '"}'  # < 1 Mi chars
    elif kind == "raw_context-over-1MiB":
        req.raw_context = "c" * (MIB + 1)
    elif kind == "raw_context-over-1MiB-multibyte":
        req.raw_context = "€" * (MIB // 3 + 1)  # 349526 characters, 1048578 bytes
    return req


BAD_STEPS = {
    "step_id-0": "step_id",
    "tool_name-empty": "tool_name",
    "tool_name-129-bytes": "tool_name",
    "tool_name-129-bytes-multibyte": "tool_name",
    "arguments_json-over-1MiB": "arguments_json",
    "arguments_json-over-1MiB-multibyte": "arguments_json",
    "raw_context-over-1MiB": "raw_context",
    "raw_context-over-1MiB-multibyte": "raw_context",
}


@pytest.mark.parametrize("kind", list(BAD_STEPS))
async def test_execute_step_validation_is_invalid_argument_and_changes_nothing(
        a, b, store, uniq, kind):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1}, context="first")
    for stub in (a, b):
        expect_error(stub.ExecuteStep, _bad_step(kind, agent.tx, agent.next), INVALID,
                     BAD_STEPS[kind])
    view = get(a, agent.tx)
    assert view.next_step_id == 2
    assert list(view.constraints) == []
    assert [(c.step_id, c.raw_context) for c in view.context] == [(1, "first")]
    assert len(await _step_keys(store, agent.tx)) == 1
    # ... and the transaction carries on normally with step 2.
    assert agent.ok("kv.get", {"key": f"k-{uniq}"}) == {"key": f"k-{uniq}", "value": 1}


@pytest.mark.parametrize(("request_", "fragment"), [
    (pb.DecideApprovalRequest(approve=True, digest=""), "digest must be the 64"),
    (pb.DecideApprovalRequest(approve=True, digest="ab" * 31), "digest must be the 64"),
    (pb.DecideApprovalRequest(approve=True, digest="AB" * 32), "digest must be the 64"),
    (pb.DecideApprovalRequest(approve=False, reason=" "), "reason is required to reject"),
    (pb.DecideApprovalRequest(approve=False, reason="r" * 1025), "reason is 1025 bytes"),
])
def test_a_decision_is_checked_before_any_transaction_is_looked_up(a, request_, fragment):
    request_.transaction_id = str(uuid.uuid4())
    expect_error(a.DecideApproval, request_, INVALID, fragment)


def test_list_approvals_refuses_a_page_token_it_never_handed_out(a):
    expect_error(a.ListApprovals, pb.ListApprovalsRequest(page_token="../txh/x"), INVALID,
                 "page_token is not a token")


def test_validation_comes_before_not_found(a):
    unknown = str(uuid.uuid4())
    expect_error(a.ExecuteStep, _bad_step("step_id-0", unknown, 1), INVALID, "step_id")
    expect_error(a.ExecuteStep, _bad_step("tool_name-empty", unknown, 1), INVALID, "tool_name")


def test_execute_step_accepts_the_size_limits_exactly(a, uniq):
    agent = Agent(a)
    # a 128-byte tool name is valid input: the step runs and fails as an unknown tool
    resp = agent.step("é" * 64, {"key": "k"})
    expect_failure(resp, "undefined_function")
    assert resp.next_step_id == 1
    # raw_context and arguments_json of exactly 1 MiB are accepted
    context = "ü" * (MIB // 2)
    head = f'{{"key": "big-{uniq}", "value": "'
    args = head + "x" * (MIB - len(head) - 2) + '"}'
    assert len(args.encode()) == MIB and len(context.encode()) == MIB
    resp = agent.step("kv.put", raw=args, context=context)
    assert output(resp)["value"] == "x" * (MIB - len(head) - 2)
    assert get(a, agent.tx).context[0].raw_context == context


# ---- RollbackTransaction.to_step range ---------------------------------------------------

async def test_rollback_to_step_at_or_beyond_next_step_is_invalid_and_changes_nothing(
        a, b, store, sandbox, uniq):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1})
    agent.ok("fs.write", {"path": f"to-step-{uniq}.txt", "contents": "kept"})
    assert agent.next == 3
    for to_step in (3, 4, 2**32 - 1):
        for stub in (a, b):
            expect_error(stub.RollbackTransaction, pb.RollbackTransactionRequest(
                transaction_id=agent.tx, to_step=to_step), INVALID, "to_step", "3")
    assert get(a, agent.tx).next_step_id == 3
    assert len(await _step_keys(store, agent.tx)) == 2
    assert (sandbox / f"to-step-{uniq}.txt").read_text() == "kept"


def test_rollback_to_step_out_of_range_on_an_unknown_transaction_is_not_found(a):
    expect_error(a.RollbackTransaction, pb.RollbackTransactionRequest(
        transaction_id=str(uuid.uuid4()), to_step=5), NOT_FOUND, "not found")


# ---- NOT_FOUND: unknown, committed, aborted ---------------------------------------------

def _ended(a, uniq: str, how: str) -> tuple[str, int]:
    """A transaction id in state `how`, and the step id it expected before it ended."""
    if how == "unknown":
        return str(uuid.uuid4()), 1
    if how == "not-a-uuid":
        return f"tx-{uniq}", 1
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"ended-{how}-{uniq}", "value": 1})
    if how == "committed":
        assert agent.commit().committed
    else:
        resp = agent.rollback(reason="test abort")
        assert (resp.rolled_back, resp.next_step_id) == (True, 0)
    return agent.tx, 2


@pytest.mark.parametrize("how", ["unknown", "not-a-uuid", "committed", "aborted"])
def test_every_rpc_answers_not_found_for_a_transaction_that_is(a, b, uniq, how):
    tx, step = _ended(a, uniq, how)
    calls = [
        ("ExecuteStep", pb.ExecuteStepRequest(transaction_id=tx, step_id=step, tool_name="kv.put",
                                              arguments_json='{"key": "x"}')),
        ("CommitTransaction", pb.CommitTransactionRequest(transaction_id=tx)),
        ("RollbackTransaction", pb.RollbackTransactionRequest(transaction_id=tx, to_step=1)),
        ("RollbackTransaction", pb.RollbackTransactionRequest(transaction_id=tx)),
        ("GetTransaction", pb.GetTransactionRequest(transaction_id=tx)),
    ]
    for stub in (a, b):
        for method, request in calls:
            expect_error(getattr(stub, method), request, NOT_FOUND, "not found", tx)


# ---- FAILED_PRECONDITION: step order ----------------------------------------------------

async def test_wrong_step_order_is_failed_precondition_and_changes_nothing(
        a, b, store, sandbox, uniq):
    agent = Agent(a)
    expect_error(b.ExecuteStep, pb.ExecuteStepRequest(
        transaction_id=agent.tx, step_id=2, tool_name="fs.write",
        arguments_json=json.dumps({"path": f"order-{uniq}.txt", "contents": "x"})),
        PRECONDITION, "expects step 1")
    assert [p.name for p in sandbox.iterdir() if f"order-{uniq}" in p.name] == []
    for stub in (a, b):
        for step_id in (2, 7):
            resp_err = expect_error(stub.ExecuteStep, pb.ExecuteStepRequest(
                transaction_id=agent.tx, step_id=step_id, tool_name="kv.put",
                arguments_json=json.dumps({"key": f"k-{uniq}"})), PRECONDITION, "expects step 1")
            assert str(step_id) in resp_err.details()
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": "first"})
    for stub in (a, b):  # replaying step 1, or skipping ahead
        for step_id in (1, 3):
            expect_error(stub.ExecuteStep, pb.ExecuteStepRequest(
                transaction_id=agent.tx, step_id=step_id, tool_name="kv.put",
                arguments_json=json.dumps({"key": f"k-{uniq}", "value": "replayed"})),
                PRECONDITION, "expects step 2")
    assert get(b, agent.tx).next_step_id == 2
    assert len(await _step_keys(store, agent.tx)) == 1
    assert agent.ok("kv.get", {"key": f"k-{uniq}"}, stub=b)["value"] == "first"


# ---- GetTransaction ----------------------------------------------------------------------

def test_get_transaction_reports_state_and_the_context_of_live_steps(a, b, uniq):
    agent = Agent(a, agent_id=f"agent-ü-{uniq}", metadata={"team": "qa"})
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1}, context="ctx one")
    agent.ok("kv.put", {"key": f"j-{uniq}", "value": 2})  # no raw_context: not in the log
    failed = agent.step("kv.get", {"key": f"missing-{uniq}"}, context="ctx failed")
    hint = expect_failure(failed, "no_data_found", f"missing-{uniq}")
    agent.ok("kv.get", {"key": f"k-{uniq}"}, context="ctx three ✓")
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 4}, context="ctx four")
    assert agent.rollback(to_step=4).rolled_back
    for stub in (a, b):
        view = get(stub, agent.tx)
        assert view.transaction_id == agent.tx
        assert view.status == pb.TRANSACTION_STATUS_ACTIVE
        assert view.agent_id == f"agent-ü-{uniq}"
        assert view.next_step_id == 4
        assert view.global_resets == 0
        assert list(view.constraints) == [hint]
        assert [(c.step_id, c.tool_name, c.raw_context) for c in view.context] == [
            (1, "kv.put", "ctx one"), (3, "kv.get", "ctx three ✓")]


def test_constraints_are_aggregated_once_per_distinct_hint(a, uniq):
    agent = Agent(a, max_local_depth=16, max_global_resets=0)
    first = expect_failure(agent.step("kv.get", {"key": f"nope-{uniq}"}), "no_data_found")
    again = expect_failure(agent.step("kv.get", {"key": f"nope-{uniq}"}), "no_data_found")
    assert first == again
    other = expect_failure(agent.step("kv.get", {"key": f"nah-{uniq}"}), "no_data_found")
    ok = agent.step("kv.put", {"key": f"nope-{uniq}"})
    assert list(ok.constraints) == [first, other]
    assert list(get(a, agent.tx).constraints) == [first, other]
