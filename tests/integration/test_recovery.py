"""Recovery end to end: error cleaner -> constraints -> provenance -> planner -> undo
(docs/recovery.md).

Every scenario runs through the gRPC API of the two real replicas sharing one real etcd
(tests/integration/conftest.py), alternating replicas between calls, and checks what an
agent sees: strategy, rollback_to_step, next_step_id, context_reset, error_category, the
hint, the aggregated constraints (each distinct hint once, surviving every rollback),
GetTransaction, and the files on disk in the shared sandbox.

Scenarios using the example SAGA tool `ticket.create` need the example package in the
service's environment (`pip install -e examples/agenttx-example-tools`; scripts/bootstrap.sh
does it); without it they are skipped, saying so. Policies are published straight into
etcd, as the operator would, and observed through the strategies a transaction gets.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import pathlib
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from agenttx.contracts.policy import PublishedPolicy, policy_to_json
from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import KEYS, expect_error, expect_failure
from support.service import Agent, ServiceProcess
from support.waiting import eventually_async, slack

LOCAL = pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK
JUMP = pb.ROLLBACK_STRATEGY_DEPENDENCY_JUMP
RESET = pb.ROLLBACK_STRATEGY_GLOBAL_RESET
MANUAL = pb.ROLLBACK_STRATEGY_MANUAL
ABORT = pb.ROLLBACK_STRATEGY_ABORT
NAMES = {v: k for k, v in pb.RollbackStrategy.items()}


def rolled(resp: pb.ExecuteStepResponse, strategy: int, category: str, *hint: str,
           to: int, nxt: int, reset: bool = False) -> str:
    """A failed step answered with `strategy`; returns the hint (see support.rpc)."""
    text = expect_failure(resp, category, *hint)
    assert resp.strategy == strategy, (NAMES[resp.strategy], resp.abort_reason,
                                       list(resp.compensation_errors))
    assert (resp.rollback_to_step, resp.next_step_id, resp.context_reset) == (to, nxt, reset)
    assert resp.rollback_latency_ms >= 0.0
    if strategy == ABORT:
        assert resp.status == pb.STEP_STATUS_FAILED and resp.abort_reason
    else:
        assert resp.status == pb.STEP_STATUS_ROLLBACK_TRIGGERED and not resp.abort_reason
    if strategy != MANUAL:
        assert not resp.compensation_errors
    assert len(set(resp.constraints)) == len(resp.constraints), list(resp.constraints)
    return text


def context_of(agent: Agent, stub: Any = None) -> list[tuple[int, str, str]]:
    view = (stub or agent.stub).GetTransaction(pb.GetTransactionRequest(transaction_id=agent.tx))
    return [(c.step_id, c.tool_name, c.raw_context) for c in view.context]


def assert_ended(agent: Agent, *stubs: Any) -> None:
    for stub in stubs:
        expect_error(stub.GetTransaction, pb.GetTransactionRequest(transaction_id=agent.tx),
                     grpc.StatusCode.NOT_FOUND, agent.tx)
        expect_error(stub.ExecuteStep, pb.ExecuteStepRequest(
            transaction_id=agent.tx, step_id=1, tool_name="kv.get", arguments_json="{}"),
            grpc.StatusCode.NOT_FOUND)


@pytest.fixture
def work(sandbox: pathlib.Path, uniq: str) -> Iterator[pathlib.Path]:
    """This test's folder in the replicas' shared sandbox; paths below are relative to it."""
    folder = sandbox / "recovery" / uniq
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# ---- LOCAL_BACKTRACK, then escalation to the nearest dependency --------------------------

def test_local_backtrack_while_attempts_within_depth_then_jump_to_the_step_that_wrote_the_row(
        a, b, uniq):
    agent = Agent(a, agent_id=f"it-{uniq}", max_local_depth=2)
    oid = f"o-{uniq}"
    agent.ok("record.insert", {"table": "orders", "id": oid, "fields": {"sku": "A"}},
             context="order created")
    agent.ok("kv.put", {"key": f"note-{uniq}", "value": "x"}, context="note", stub=b)
    dup = {"table": "orders", "id": oid, "fields": {"sku": "B"}}
    first = None
    for attempt, stub in ((1, a), (2, b)):
        hint = rolled(agent.step("record.insert", dup, stub=stub), LOCAL, "unique_violation",
                      oid, '"orders"', to=3, nxt=3)
        first = first or hint
        assert hint == first
        # a LOCAL_BACKTRACK undoes nothing: the context log still has both steps
        assert [s for s, _, _ in context_of(agent, stub)] == [1, 2], attempt
    # attempt 3 > max_local_depth 2: step 3 touched row orders/<oid>, last written by step 1
    resp = agent.step("record.insert", dup)
    rolled(resp, JUMP, "unique_violation", oid, to=1, nxt=1)
    assert list(resp.constraints) == [first]  # the same hint three times: recorded once
    view = b.GetTransaction(pb.GetTransactionRequest(transaction_id=agent.tx))
    assert (view.next_step_id, view.global_resets, list(view.constraints), list(view.context)) \
        == (1, 0, [first], [])
    # the undone insert is gone: the same row can be inserted again, and committed;
    # successful steps report the aggregated constraints too
    resp = agent.step("record.insert", {"table": "orders", "id": oid, "fields": {"sku": "C"}},
                      stub=b)
    assert resp.status == pb.STEP_STATUS_SUCCESS and list(resp.constraints) == [first]
    assert (agent.commit().committed, agent.next) == (True, 2)
    again = Agent(b)
    assert again.ok("record.get", {"table": "orders", "id": oid})["fields"] == {"sku": "C"}


def test_escalation_jumps_to_the_nearest_of_several_dependencies(a, b, uniq):
    """Step 5 depends on step 1 (the row it collides with) and step 3 (a reference):
    once depth is exhausted it jumps to 3, the nearest, and steps 1-2 stay live."""
    agent = Agent(a, max_local_depth=1)
    oid = f"o-{uniq}"
    agent.ok("record.insert", {"table": "orders", "id": oid}, context="c1")
    agent.ok("kv.put", {"key": f"n1-{uniq}", "value": 1}, context="c2", stub=b)
    agent.ok("kv.put", {"key": f"sku-{uniq}", "value": "B"}, context="c3")
    agent.ok("kv.put", {"key": f"n2-{uniq}", "value": 2}, context="c4", stub=b)
    args = {"table": "orders", "id": oid, "fields": {"sku": "${steps.3.value}"}}
    hint = rolled(agent.step("record.insert", args), LOCAL, "unique_violation", oid, to=5, nxt=5)
    rolled(agent.step("record.insert", args, stub=b), JUMP, "unique_violation", to=3, nxt=3)
    assert context_of(agent) == [(1, "record.insert", "c1"), (2, "kv.put", "c2")]
    # the counter restarts: step 3 is new, so one local retry is allowed again
    assert agent.step("kv.get", {"key": f"missing-{uniq}"}).strategy == LOCAL
    assert list(agent.get().constraints)[0] == hint


# ---- culprit DEPENDENCY_JUMP (first failure, no local retries) ---------------------------

def test_foreign_key_violation_jumps_to_the_step_that_produced_the_value_and_removes_its_file(
        a, b, uniq, work, sandbox):
    agent = Agent(a)
    draft = work / "draft.txt"
    rel = str(draft.relative_to(sandbox))
    agent.ok("kv.put", {"key": f"cust-{uniq}", "value": f"c-404-{uniq}"}, context="picked customer")
    agent.ok("fs.write", {"path": rel, "contents": "draft"}, context="drafted", stub=b)
    assert draft.read_text() == "draft"
    resp = agent.step("record.insert", {
        "table": "orders", "id": f"o-{uniq}", "fields": {"customer_id": "${steps.1.value}"},
        "references": {"customer_id": "customers"}})
    rolled(resp, JUMP, "foreign_key_violation", "customer_id", f"c-404-{uniq}", '"customers"',
           to=1, nxt=1)
    assert resp.rollback_latency_ms > 0.0
    assert not draft.exists()  # step 2 was undone on its way back to step 1
    assert context_of(agent, b) == []
    # redo from step 1 with a customer that exists
    agent.ok("record.insert", {"table": "customers", "id": f"c-{uniq}"}, stub=b)
    agent.ok("record.insert", {"table": "orders", "id": f"o-{uniq}",
                               "fields": {"customer_id": "${steps.1.id}"},
                               "references": {"customer_id": "customers"}})
    assert agent.commit().steps_committed == 2


def test_no_data_found_jumps_to_the_step_that_produced_the_key(a, b, uniq):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"ptr-{uniq}", "value": f"missing-{uniq}"}, context="c1")
    agent.ok("kv.put", {"key": f"other-{uniq}", "value": 1}, context="c2", stub=b)
    rolled(agent.step("kv.get", {"key": "${steps.1.value}"}), JUMP, "no_data_found",
           f"missing-{uniq}", to=1, nxt=1)
    # the same for a record id that came from a reference (a number: JSON types kept)
    agent.ok("kv.put", {"key": f"ptr-{uniq}", "value": 404404}, stub=b)
    agent.ok("kv.put", {"key": f"other-{uniq}", "value": 2})
    hint = rolled(agent.step("record.get", {"table": f"orders_{uniq}", "id": "${steps.1.value}"},
                             stub=b), JUMP, "no_data_found", "404404", f"orders_{uniq}",
                  to=1, nxt=1)
    assert len(agent.get().constraints) == 2 and hint in agent.get().constraints


def test_no_data_found_after_kv_delete_jumps_to_the_delete(a, b, uniq):
    key = f"gone-{uniq}"
    agent = Agent(a)
    agent.ok("kv.put", {"key": key, "value": "v"}, context="c1")
    assert agent.ok("kv.delete", {"key": key}, context="c2", stub=b)["deleted"] is True
    agent.ok("kv.put", {"key": f"other-{uniq}", "value": 1}, context="c3")
    rolled(agent.step("kv.get", {"key": key}, stub=b), JUMP, "no_data_found", key, to=2, nxt=2)
    assert context_of(agent) == [(1, "kv.put", "c1")]
    # with the delete undone, step 1's write is visible again
    assert agent.ok("kv.get", {"key": key}) == {"key": key, "value": "v"}


def test_undefined_file_jumps_to_the_step_that_named_the_path_and_restores_overwritten_bytes(
        a, b, uniq, work, sandbox):
    notes = work / "notes.txt"
    notes.write_text("original")
    agent = Agent(b)
    missing = str((work / "missing.txt").relative_to(sandbox))
    agent.ok("kv.put", {"key": f"path-{uniq}", "value": missing}, context="c1")
    agent.ok("fs.write", {"path": str(notes.relative_to(sandbox)), "contents": "changed"},
             context="c2", stub=a)
    assert notes.read_text() == "changed"
    resp = agent.step("fs.read", {"path": "${steps.1.value}"})
    rolled(resp, JUMP, "undefined_file", missing, to=1, nxt=1)
    assert notes.read_text() == "original"
    assert context_of(agent, a) == []


def test_culprit_categories_without_provenance_retry_locally(a, b, uniq):
    """No `${steps…}` reference behind the offending value, no culprit: a literal is the
    agent's own choice, even when another argument depends on a live step."""
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": "note"})
    rolled(agent.step("fs.read", {"path": f"recovery/{uniq}/nope.txt"}), LOCAL, "undefined_file",
           f"recovery/{uniq}/nope.txt", to=2, nxt=2)
    rolled(agent.step("record.insert", {
        "table": "orders", "id": f"o-{uniq}",
        "fields": {"note": "${steps.1.value}", "customer_id": f"c-missing-{uniq}"},
        "references": {"customer_id": "customers"}}, stub=b),
        LOCAL, "foreign_key_violation", f"c-missing-{uniq}", to=2, nxt=2)


# ---- GLOBAL_RESET, then ABORT -------------------------------------------------------------

def test_global_reset_then_abort_on_the_next_reset(a, b, uniq, work, sandbox):
    existing, created = work / "existing.txt", work / "created.txt"
    existing.write_text("original")
    rel = {p: str(p.relative_to(sandbox)) for p in (existing, created)}
    agent = Agent(a, agent_id=f"reset-{uniq}", max_local_depth=0)   # resets: default 1
    agent.ok("fs.write", {"path": rel[existing], "contents": "v1"}, context="c1")
    agent.ok("fs.write", {"path": rel[created], "contents": "new"}, context="c2", stub=b)
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1}, context="c3")
    assert [s for s, _, _ in context_of(agent)] == [1, 2, 3]

    resp = agent.step("kv.gett", {"key": f"k-{uniq}"}, stub=b)
    h1 = rolled(resp, RESET, "undefined_function", '"kv.gett"', '"kv.get"', to=0, nxt=1,
                reset=True)
    assert resp.rollback_latency_ms > 0.0
    assert existing.read_text() == "original" and not created.exists()
    view = a.GetTransaction(pb.GetTransactionRequest(transaction_id=agent.tx))
    assert view.status == pb.TRANSACTION_STATUS_ACTIVE
    assert (view.next_step_id, view.global_resets, list(view.context), list(view.constraints)) \
        == (1, 1, [], [h1])

    agent.ok("fs.write", {"path": rel[existing], "contents": "v2"}, context="again")
    agent.ok("fs.write", {"path": rel[created], "contents": "new again"}, stub=b)
    resp = agent.step("kv.put", {"key": 5, "value": 1})
    h2 = rolled(resp, ABORT, "invalid_parameter_value", '"key"', to=0, nxt=0, reset=True)
    assert "global reset limit" in resp.abort_reason and "1 of 1" in resp.abort_reason
    assert list(resp.constraints) == [h1, h2]  # the constraints survived the reset
    assert existing.read_text() == "original" and not created.exists()
    assert_ended(agent, a, b)


# ---- replay budget -------------------------------------------------------------------------

def test_replay_budget_abort_when_a_reset_would_exceed_it(a, b, uniq, work, sandbox):
    created = work / "budget.txt"
    agent = Agent(b, max_local_depth=0, max_global_resets=5, replay_budget_factor=0.5)
    agent.ok("kv.put", {"key": f"k1-{uniq}", "value": 1})
    agent.ok("fs.write", {"path": str(created.relative_to(sandbox)), "contents": "x"}, stub=a)
    agent.ok("kv.put", {"key": f"k3-{uniq}", "value": 3})
    # a reset would undo 3 steps; the budget is 0.5 x highest step 4 = 2
    resp = agent.step("no.such.tool", {}, stub=a)
    rolled(resp, ABORT, "undefined_function", '"no.such.tool"', to=0, nxt=0, reset=True)
    assert "replay budget" in resp.abort_reason and "2" in resp.abort_reason, resp.abort_reason
    assert not created.exists()
    assert_ended(agent, a, b)


def test_replay_budget_counts_every_undone_step_across_rollbacks(a, b, uniq):
    agent = Agent(a, max_local_depth=0, max_global_resets=5, replay_budget_factor=1.0)
    agent.ok("kv.put", {"key": f"k1-{uniq}", "value": 1})
    agent.ok("kv.put", {"key": f"k2-{uniq}", "value": 2}, stub=b)
    # first reset: 2 steps undone, within 1.0 x highest step 3
    rolled(agent.step("kv.gett", {}), RESET, "undefined_function", to=0, nxt=1, reset=True)
    agent.ok("kv.put", {"key": f"k1-{uniq}", "value": 1}, stub=b)
    agent.ok("kv.put", {"key": f"k2-{uniq}", "value": 2})
    # second reset: 2 + 2 = 4 > 3 -> ABORT, although resets are still available
    resp = agent.step("kv.gett", {}, stub=b)
    rolled(resp, ABORT, "undefined_function", to=0, nxt=0, reset=True)
    assert "replay budget" in resp.abort_reason
    assert_ended(agent, a)


def test_replay_budget_also_stops_a_culprit_jump(a, b, uniq):
    agent = Agent(a, replay_budget_factor=0.1)
    agent.ok("kv.put", {"key": f"ptr-{uniq}", "value": f"missing-{uniq}"})
    agent.ok("kv.put", {"key": f"other-{uniq}", "value": 1}, stub=b)
    # the jump to step 1 would undo 2 steps; the budget is 0.1 x 3
    resp = agent.step("kv.get", {"key": "${steps.1.value}"})
    rolled(resp, ABORT, "no_data_found", f"missing-{uniq}", to=0, nxt=0, reset=True)
    assert "replay budget" in resp.abort_reason and "DEPENDENCY_JUMP" in resp.abort_reason
    assert_ended(agent, b)


# ---- zero depths (request policy) -----------------------------------------------------------

def test_zero_depths_abort_on_the_first_failure_without_dependencies(a, b, uniq):
    agent = Agent(a, max_local_depth=0, max_global_resets=0)
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1})
    resp = agent.step("kv.gett", {}, stub=b)
    rolled(resp, ABORT, "undefined_function", to=0, nxt=0, reset=True)
    assert "global reset limit" in resp.abort_reason and "0 of 0" in resp.abort_reason
    assert_ended(agent, a, b)
    # ... even when nothing is live yet
    first = Agent(b, max_local_depth=0, max_global_resets=0)
    rolled(first.step("kv.put", {}), ABORT, "invalid_parameter_value", '"key"', to=0, nxt=0,
           reset=True)
    assert_ended(first, a)


def test_a_global_reset_with_nothing_live_still_counts(a, b, uniq):
    agent = Agent(a, max_local_depth=1, max_global_resets=1)
    rolled(agent.step("kv.gett", {}), LOCAL, "undefined_function", to=1, nxt=1)
    rolled(agent.step("kv.gett", {}, stub=b), RESET, "undefined_function", to=0, nxt=1, reset=True)
    assert agent.get().global_resets == 1
    # the attempt counter restarted with the reset: one local retry again, then ABORT
    rolled(agent.step("kv.gett", {}), LOCAL, "undefined_function", to=1, nxt=1)
    rolled(agent.step("kv.gett", {}, stub=b), ABORT, "undefined_function", to=0, nxt=0, reset=True)
    assert_ended(agent, a)


def test_zero_local_depth_jumps_to_a_dependency_on_the_first_failure(a, b, uniq):
    agent = Agent(b, max_local_depth=0, max_global_resets=0)
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1}, context="c1")
    agent.ok("kv.put", {"key": f"j-{uniq}", "value": 2}, context="c2", stub=a)
    # step 3 references step 1: its (non-culprit) failure jumps there at once
    rolled(agent.step("kv.put", {"key": "${steps.1.key}", "value": 1, "bogus": 1}), JUMP,
           "invalid_parameter_value", '"bogus"', to=1, nxt=1)
    assert context_of(agent, a) == []


# ---- MANUAL after a sabotaged undo -----------------------------------------------------------

needs_example_tools = pytest.mark.skipif(
    importlib.util.find_spec("agenttx_example_tools") is None,
    reason="example tools not installed: pip install -e examples/agenttx-example-tools")

class FileStep:
    """A step that creates one file in the replicas' shared sandbox: the built-in fs.write,
    or the example package's SAGA tool ticket.create (compensation: delete the file)."""

    def __init__(self, tool: str, sandbox: pathlib.Path, work: pathlib.Path, uniq: str) -> None:
        self.tool, self.uniq, self.sandbox = tool, uniq, sandbox
        self.path = (work / "m.txt" if tool == "fs.write"
                     else sandbox / "tickets" / f"M-{uniq}.json")

    def args(self, version: str) -> dict[str, Any]:
        if self.tool == "fs.write":
            return {"path": str(self.path.relative_to(self.sandbox)), "contents": version}
        return {"id": f"M-{self.uniq}", "title": version}

    def version(self) -> str:
        text = self.path.read_text()
        return text if self.tool == "fs.write" else json.loads(text)["title"]

    def sabotage(self) -> None:
        """Replace the file by a non-empty directory: neither restore nor delete can undo it."""
        self.path.unlink()
        self.path.mkdir()
        (self.path / "blocker").write_text("in the way")


WRITERS = [
    "fs.write",
    pytest.param("ticket.create", marks=needs_example_tools),
]


@pytest.mark.parametrize("tool", WRITERS)
def test_manual_after_a_sabotaged_undo_recovers_once_the_obstacle_is_gone(
        a, b, uniq, work, sandbox, tool):
    file = FileStep(tool, sandbox, work, uniq)
    agent = Agent(a, max_local_depth=0)
    agent.ok(tool, file.args("v1"), context="c1")
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1}, context="c2", stub=b)
    file.sabotage()

    # a global reset undoes step 2, then fails on step 1: MANUAL, step 1 still live
    resp = agent.step("kv.gett", {})
    hint = rolled(resp, MANUAL, "undefined_function", to=2, nxt=2)
    assert resp.status == pb.STEP_STATUS_ROLLBACK_TRIGGERED
    assert len(resp.compensation_errors) == 1, list(resp.compensation_errors)
    assert file.path.name in resp.compensation_errors[0] and "step 1" in resp.compensation_errors[0]
    for stub in (a, b):
        expect_error(stub.ExecuteStep, pb.ExecuteStepRequest(
            transaction_id=agent.tx, step_id=2, tool_name="kv.put",
            arguments_json='{"key": "x"}'), grpc.StatusCode.FAILED_PRECONDITION, "manual rollback")
        expect_error(stub.CommitTransaction, pb.CommitTransactionRequest(transaction_id=agent.tx),
                     grpc.StatusCode.FAILED_PRECONDITION, "manual rollback")
        view = stub.GetTransaction(pb.GetTransactionRequest(transaction_id=agent.tx))
        assert view.status == pb.TRANSACTION_STATUS_AWAITING_ROLLBACK
        assert (view.next_step_id, list(view.constraints)) == (2, [hint])
        assert [c.step_id for c in view.context] == [1]

    # still blocked: RollbackTransaction reports the same failure and changes nothing
    again = agent.rollback(to_step=1, reason="retry undo")
    assert (again.rolled_back, again.next_step_id) == (False, 2)
    assert len(again.compensation_errors) == 1 and file.path.name in again.compensation_errors[0]
    assert agent.get().status == pb.TRANSACTION_STATUS_AWAITING_ROLLBACK

    shutil.rmtree(file.path)  # the operator removes the obstacle
    done = b.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=agent.tx, to_step=1))
    assert (done.rolled_back, done.next_step_id, done.compensations_run,
            list(done.compensation_errors)) == (True, 1, 1, [])
    agent.next = 1
    view = agent.get()
    assert view.status == pb.TRANSACTION_STATUS_ACTIVE
    assert (view.next_step_id, list(view.context), list(view.constraints)) == (1, [], [hint])
    # ... and the transaction continues normally
    agent.ok(tool, file.args("v2"), stub=b)
    assert agent.commit().steps_committed == 1
    assert file.version() == "v2"


@pytest.mark.parametrize("tool", WRITERS)
def test_manual_from_rollback_transaction_then_abort_once_fixed(a, b, uniq, work, sandbox, tool):
    file = FileStep(tool, sandbox, work, uniq)
    agent = Agent(b)
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1})
    agent.ok(tool, file.args("v1"), stub=a)
    agent.ok("kv.put", {"key": f"j-{uniq}", "value": 2})
    file.sabotage()

    resp = agent.rollback(reason="give up")  # unset to_step: abort
    assert resp.rolled_back is False and resp.next_step_id == 3
    assert resp.compensations_run == 1  # step 3 was undone before step 2 failed
    assert len(resp.compensation_errors) == 1 and file.path.name in resp.compensation_errors[0]
    expect_error(a.ExecuteStep, pb.ExecuteStepRequest(
        transaction_id=agent.tx, step_id=3, tool_name="kv.get", arguments_json="{}"),
        grpc.StatusCode.FAILED_PRECONDITION)
    assert agent.get().status == pb.TRANSACTION_STATUS_AWAITING_ROLLBACK

    shutil.rmtree(file.path)
    resp = a.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=agent.tx))
    # the rollback resumes where it stopped; undoing an already-absent file is a success
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 0, 2)
    assert not file.path.exists()
    assert_ended(agent, a, b)


# ---- policy resolution (docs/recovery.md#the-policy, docs/kubernetes.md#3-apply-policies) ----

def probe(stub: Any, agent_id: str, metadata: dict[str, str] | None = None,
          **policy: Any) -> tuple[int, int]:
    """(max_local_depth, max_global_resets) as a transaction of this agent experiences them:
    fail step 1 until the planner escalates, count the local retries and the resets."""
    agent = Agent(stub, agent_id=agent_id, metadata=metadata, **policy)
    depth = resets = 0
    for _ in range(17 * 17):
        if agent.next == 1:  # a live step for resets to undo
            agent.ok("kv.put", {"key": f"probe-{agent.tx}", "value": 1})
        resp = agent.step("probe.fail", {})
        if resp.strategy == LOCAL:
            depth += 1
        elif resp.strategy == RESET:
            resets += 1
            depth = 0
        else:
            assert resp.strategy == ABORT, NAMES[resp.strategy]
            return depth, resets
    raise AssertionError("no abort")


def budget_abort_reason(stub: Any, agent_id: str, **policy: Any) -> str:
    """Two live steps, then a failure that resets (or aborts on the budget)."""
    agent = Agent(stub, agent_id=agent_id, max_local_depth=0, max_global_resets=1, **policy)
    agent.ok("kv.put", {"key": f"{agent_id}-1", "value": 1})
    agent.ok("kv.put", {"key": f"{agent_id}-2", "value": 2})
    resp = agent.step("probe.fail", {})
    if resp.strategy == ABORT:
        return resp.abort_reason
    agent.rollback()
    return NAMES[resp.strategy]


async def poll(check: Any) -> None:
    """Wait for `check()`: a published policy reaches every replica through its watch, at
    once on a quiet machine."""
    async def checked() -> Any:
        return check()
    await eventually_async(checked, slack(1.0), "the published policy is picked up")


@pytest.fixture
def defaults_replica(etcd, scratch, sandbox) -> Iterator[Any]:
    """A third replica on the shared prefix whose server defaults are depth 1, resets 0."""
    proc = ServiceProcess("replica-defaults", etcd_endpoints=etcd.endpoints, prefix=KEYS.prefix,
                          fs_root=str(sandbox), workdir=scratch / "replicas",
                          env={"AGENTTX_DEFAULT_POLICY__MAX_LOCAL_DEPTH": "1",
                               "AGENTTX_DEFAULT_POLICY__MAX_GLOBAL_RESETS": "0"})
    proc.start()
    yield proc.stub
    proc.stop()


async def test_published_policies_most_specific_wins_and_requests_override(
        a, b, defaults_replica, store, uniq):
    c = defaults_replica
    ns, base = f"it-{uniq}", f"pol-{uniq}"
    policies = [
        PublishedPolicy(ns, "broad", 1, priority=0, agent_id_prefix=base,
                        max_local_depth=1, max_global_resets=1),
        # sets depth only: resets come from the layer below (the server default)
        PublishedPolicy(ns, "longer-prefix", 1, priority=0, agent_id_prefix=f"{base}-billing",
                        max_local_depth=2),
        PublishedPolicy(ns, "more-metadata", 1, priority=0, agent_id_prefix=base,
                        match_metadata={"team": "payments"}, max_local_depth=4,
                        max_global_resets=0),
        PublishedPolicy(ns, "high-priority", 3, priority=10, agent_id_prefix=base,
                        match_metadata={"tier": "gold"}, max_local_depth=5, max_global_resets=2),
        PublishedPolicy(ns, "tight-budget", 1, priority=0, agent_id_prefix=f"{base}-tight",
                        replay_budget_factor=0.1),
        # written last: once a replica applies it, it has applied all of the above
        PublishedPolicy(ns, "sentinel", 1, priority=0, agent_id_prefix=f"{base}-sentinel",
                        max_local_depth=0, max_global_resets=0),
    ]
    keys = [KEYS.policies_prefix() + p.key.encode() for p in policies]
    try:
        for key, p in zip(keys, policies, strict=True):
            await store.put(key, policy_to_json(p))
        for stub in (a, b, c):
            await poll(lambda stub=stub: probe(stub, f"{base}-sentinel") == (0, 0))

        for stub in (a, b):
            assert probe(stub, f"other-{uniq}") == (3, 1)                    # server defaults
            assert probe(stub, f"{base}-x") == (1, 1)                        # broad
            assert probe(stub, f"{base}-billing-7") == (2, 1)                # longest prefix
            assert probe(stub, f"{base}-x", {"team": "payments"}) == (4, 0)  # most metadata
            # prefix length ranks before metadata count
            assert probe(stub, f"{base}-billing-7", {"team": "payments"}) == (2, 1)
            # priority ranks first
            assert probe(stub, f"{base}-billing-7", {"tier": "gold"}) == (5, 2)
            # request fields override the policy, field by field
            assert probe(stub, f"{base}-billing-7", {"tier": "gold"}, max_local_depth=0) == (0, 2)
            assert probe(stub, f"{base}-x", max_global_resets=2) == (1, 2)
        reason = budget_abort_reason(a, f"{base}-tight")
        assert "replay budget" in reason and "0.1 x" in reason, reason
        assert budget_abort_reason(b, f"{base}-tight", replay_budget_factor=1000.0) == \
            "ROLLBACK_STRATEGY_GLOBAL_RESET"
        # server defaults are the bottom layer of each field, per replica
        assert probe(c, f"other-{uniq}") == (1, 0)
        assert probe(c, f"{base}-billing-7") == (2, 0)
    finally:
        for key in keys:
            await store.delete(key)
    for stub in (a, b, c):
        await poll(lambda stub=stub: probe(stub, f"{base}-x") != (1, 1))
    assert probe(a, f"{base}-x") == (3, 1)
    assert probe(c, f"{base}-x") == (1, 0)


# ---- custom tools go through the same cleaner ----------------------------------------------

@needs_example_tools
def test_custom_tool_duplicate_key_gets_the_builtin_category_and_hint(a, b, uniq, sandbox):
    tid = f"T-{uniq}"
    ticket = sandbox / "tickets" / f"{tid}.json"  # the replicas set no tickets dir: fs_root
    custom = Agent(a)
    custom.ok("ticket.create", {"id": tid, "title": "printer on fire"})
    assert json.loads(ticket.read_text())["transaction_id"] == custom.tx
    c = custom.step("ticket.create", {"id": tid, "title": "again"}, stub=b)

    builtin = Agent(b)
    builtin.ok("record.insert", {"table": "tickets", "id": tid})
    r = builtin.step("record.insert", {"table": "tickets", "id": tid}, stub=a)

    hint = rolled(c, LOCAL, "unique_violation", tid, '"tickets"', to=2, nxt=2)
    assert rolled(r, LOCAL, "unique_violation", to=2, nxt=2) == hint
    # the SAGA compensation runs on rollback, on whichever replica handles it
    rb = b.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=custom.tx))
    assert (rb.rolled_back, rb.compensations_run) == (True, 1)
    assert not ticket.exists()
    builtin.rollback()




def race_step(tx: str, calls: list[tuple[Any, str, dict[str, Any]]]) -> list[str]:
    """Send step 1 of `tx` from several replicas at once; each answer's status or code."""
    barrier = threading.Barrier(len(calls))

    def send(stub: Any, tool: str, args: dict[str, Any]) -> str:
        barrier.wait()
        try:
            resp = stub.ExecuteStep(pb.ExecuteStepRequest(
                transaction_id=tx, step_id=1, tool_name=tool, arguments_json=json.dumps(args)))
            return str(pb.StepStatus.Name(resp.status))
        except grpc.RpcError as err:
            return str(err.code().name)

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: send(*call), calls))


@needs_example_tools
def test_a_saga_step_that_loses_the_race_leaves_no_effect(a, b, uniq, sandbox):
    """Two replicas race on step 1 of one transaction, each creating a different ticket:
    exactly one step wins, so exactly one ticket may exist afterwards."""
    for trial in range(10):
        agent = Agent(a)
        answers = race_step(agent.tx, [
            (stub, "ticket.create", {"id": f"R-{uniq}-{trial}-{i}", "title": "t"})
            for i, stub in enumerate((a, b))])
        assert sorted(answers) == ["FAILED_PRECONDITION", "STEP_STATUS_SUCCESS"], answers
        tickets = sorted(p.name for p in (sandbox / "tickets").glob(f"R-{uniq}-{trial}-*.json"))
        assert len(tickets) == 1, (trial, answers, tickets)
        agent.rollback()
