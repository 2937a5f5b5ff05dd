"""Every answer fits (SPEC §2): the budget checks, as pure functions of the running
totals — the same cost at step 1 and step 500."""

from __future__ import annotations

from agenttx.engine.limits import (
    MAX_CONSTRAINTS_BYTES,
    RESPONSE_BYTES,
    Limits,
    add_constraint,
    check_step,
    context_cost,
)
from agenttx.engine.state import Budget

LIMITS = Limits(max_txn_ops=128, max_request_bytes=16 * 1024 * 1024)
MIB = 1024 * 1024


def check(budget: Budget, **kw) -> str | None:
    args = dict(step_compares=3, step_ops=5, step_bytes=1000, output_bytes=100, constraints=())
    return check_step(LIMITS, budget, **{**args, **kw})


def test_a_small_step_fits():
    assert check(Budget(read_keys=10, write_keys=10, write_bytes=1000)) is None


def test_the_read_set_is_bounded_by_the_commits_compares():
    assert check(Budget(read_keys=127)) is None
    message = check(Budget(read_keys=128))
    assert message.startswith("program limit exceeded") and "127" in message


def test_writes_effects_and_locks_share_the_commits_operations():
    assert check(Budget(read_keys=10, write_keys=100, effects=5, locks=10)) is None
    message = check(Budget(read_keys=10, write_keys=100, effects=6, locks=10))
    assert "120 operations" in message and "an effect costs two" in message


def test_one_step_cannot_carry_more_than_one_etcd_request():
    assert "the step would store" in check(Budget(), step_bytes=LIMITS.step_bytes + 1)
    assert "one step writes at most 128" in check(Budget(), step_ops=129)


def test_an_output_or_a_context_log_that_no_response_could_carry_is_refused():
    assert "ExecuteStep response" in check(Budget(), output_bytes=RESPONSE_BYTES)
    assert check(Budget(context_bytes=3 * MIB)) is None
    message = check(Budget(context_bytes=4 * MIB))
    assert "GetTransaction response" in message and "raw_context counts" in message
    # constraints travel in every response too
    nearly = RESPONSE_BYTES - 64 * 1024 - 1000
    assert check(Budget(), output_bytes=nearly) is None
    assert check(Budget(), output_bytes=nearly, constraints=("x" * 2000,)) is not None


def test_context_costs_its_bytes_plus_framing_and_nothing_when_empty():
    assert context_cost("kv.put", "") == 0
    assert context_cost("kv.put", "é") > len("é".encode()) + len("kv.put")


def test_constraints_are_distinct_and_bounded():
    once = add_constraint(add_constraint((), "a"), "a")
    assert once == ("a",)
    full = ()
    for i in range(10_000):
        full = add_constraint(full, f"hint {i:05d} " + "x" * 180)
    assert sum(len(c) for c in full) <= MAX_CONSTRAINTS_BYTES
    assert add_constraint(full, "one more") == full


def test_what_an_approval_would_show_must_fit_one_answer_when_approvals_apply():
    big = Budget(read_keys=1, write_keys=1, gated_bytes=4 * MIB)
    assert check(big) is None                       # no approval policy: not gated
    message = check(big, approval=True)
    assert message is not None and message.startswith("program limit exceeded")
    assert "ask a person to approve" in message
    assert check(Budget(read_keys=1, gated_bytes=MIB), approval=True) is None
