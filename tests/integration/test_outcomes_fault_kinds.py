"""Each fault kind of the outcomes benchmark, one at a time, on a real two-replica AgentTx
deployment and on the direct baselines: what each system ends with, and in how many
steps. Plus the oracle judging real read-back states it is fed wrong on purpose."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agenttx_bench.outcomes import oracle
from agenttx_bench.outcomes.faults import Fault, FaultKind
from agenttx_bench.outcomes.inject import Injector
from agenttx_bench.outcomes.plan import encode
from agenttx_bench.outcomes.runner import Bench

MOVE = 2  # move-00: request draft move src take dst put manifest readback moved (10 calls)


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    with Bench() as b:
        yield b


def one(kind: FaultKind, op: int) -> dict[int, Fault]:
    return {op: Fault(kind, "move-00", op)}


# kind, planned op, AgentTx (agent steps, client re-sends), naive_retry (outcome, steps),
# restart outcome
CASES = [
    # re-sent after invalid_parameter_value / invalid_text_representation (LOCAL_BACKTRACK)
    (FaultKind.TRANSIENT, 2, (11, 0), ("correct", 11), "correct"),
    # its replica SIGKILLed: the client re-reads the transaction on the other one, sees the
    # step did not apply and re-sends it there; the agent sent one call
    (FaultKind.REPLICA_KILL, 4, (10, 1), ("correct", 11), "corrupt"),
    # FK violation at the move row; DEPENDENCY_JUMP back to the draft that held the typo
    (FaultKind.WRONG_VALUE, 1, (12, 0), ("corrupt", 6), "correct"),
    # the manifest deleted before its read-back: DEPENDENCY_JUMP to the write, redo both
    (FaultKind.MISSING_FILE, 8, (12, 0), ("corrupt", 12), "corrupt"),
    # another agent holds the manifest's lock, then abandons its draft (baselines: it
    # puts back what it saw, deleting the manifest the agent just wrote)
    (FaultKind.LOCK_CONTENTION, 7, (11, 0), ("corrupt", 12), "corrupt"),
    # a concurrent writer commits the source counter after the agent read it: AgentTx's
    # commit conflicts and the task is redone; the baselines lose the other write
    (FaultKind.COMMIT_CONFLICT, 3, (20, 0), ("corrupt", 10), "corrupt"),
    # the receiver refuses two deliveries: AgentTx's outbox redelivers after the commit
    (FaultKind.RECEIVER_FAILURE, 9, (10, 0), ("correct", 12), "corrupt"),
]


@pytest.mark.parametrize("kind, op, agenttx_steps, naive, restart", CASES,
                         ids=[c[0].value for c in CASES])
def test_one_fault_each_system(bench, kind, op, agenttx_steps, naive, restart):
    faults = one(kind, op)
    a = bench.run_task(MOVE, "agenttx", 0.3, faults)
    assert (a.outcome, (a.steps, a.resent), a.duplicate_effects, a.leaked_effects,
            a.faults) == ("correct", agenttx_steps, 0, 0, [kind.value]), a.note
    assert a.final_state_sha256 == a.expected_state_sha256
    n = bench.run_task(MOVE, "naive_retry", 0.3, faults)
    assert (n.outcome, n.steps) == naive, n.note
    r = bench.run_task(MOVE, "restart", 0.3, faults)
    assert r.outcome == restart, r.note


def test_a_killed_replica_comes_back_and_both_serve(bench):
    kills = bench.agenttx_env.kills
    rec = bench.run_task(0, "agenttx", 0.3, {0: Fault(FaultKind.REPLICA_KILL, "order-00", 0),
                                              5: Fault(FaultKind.REPLICA_KILL, "order-00", 5)})
    assert (rec.outcome, rec.steps, rec.resent) == ("correct", 12, 2)  # order-00: 12 calls
    assert bench.agenttx_env.kills == kills + 2
    bench.agenttx_env.ready()
    assert [p.health() for p in bench.service.replicas] == ["SERVING", "SERVING"]


def run_clean(bench: Bench, system: str, index: int = MOVE):
    task = bench.new_task(index)
    env = bench.set_up(task, system)
    result = bench.agent(system).run(task, Injector(task, {}, env))
    assert result.finished, result.note
    return task


def test_the_oracle_calls_a_tampered_real_state_corrupt(bench):
    task = run_clean(bench, "naive_retry")
    exp = oracle.expect(task)
    assert oracle.judge(bench.read_back(task, "naive_retry"), exp, task.ns).outcome \
        is oracle.Outcome.CORRECT
    bench.run(bench.direct.kv_add(f"{task.ns}stock/wh-b/sku-0", 1))  # one unit out of thin air
    verdict = oracle.judge(bench.read_back(task, "naive_retry"), exp, task.ns)
    assert verdict.outcome is oracle.Outcome.CORRUPT
    assert verdict.final_sha256 != verdict.expected_sha256


def test_the_oracle_counts_a_real_duplicate_delivery(bench):
    task = run_clean(bench, "naive_retry")
    key = f"{task.ns}m-0/moved"
    sent = bench.read_back(task, "naive_retry").effects[key]
    # the same effect delivered once more, as an at-least-once sender without dedupe would
    bench.run(bench.direct.call("effect.stage", encode(
        {"channel": "webhook", "payload": sent.payloads[0], "idempotency_key": key})))
    verdict = oracle.judge(bench.read_back(task, "naive_retry"), oracle.expect(task), task.ns)
    assert (verdict.outcome, verdict.duplicate_effects, verdict.leaked_effects) == \
        (oracle.Outcome.CORRUPT, 1, 0)


def test_agenttx_refuses_to_stage_a_delivered_key_again(bench):
    task = run_clean(bench, "agenttx")
    key = f"{task.ns}m-0/moved"
    assert key in bench.read_back(task, "agenttx").effects
    with bench.agenttx_agent.client.transaction(agent_id="outcomes/test") as tx:
        r = tx.step("effect.stage", {"channel": "webhook", "payload": {}, "idempotency_key": key})
        assert (r.ok, r.category) == (False, "unique_violation")
        tx.rollback()
    verdict = oracle.judge(bench.read_back(task, "agenttx"), oracle.expect(task), task.ns)
    assert (verdict.outcome, verdict.duplicate_effects) == (oracle.Outcome.CORRECT, 0)
