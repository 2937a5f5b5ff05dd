"""The rollback planner, branch by branch (docs/recovery.md#4-the-planner). Pure: no etcd, no server."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agenttx.engine.planner import (
    CULPRIT_CATEGORIES,
    FailureFacts,
    Plan,
    PolicyLimits,
    StepTouch,
    Strategy,
    find_culprit,
    find_dependencies,
    plan_rollback,
)

DEFAULT_LIMITS = PolicyLimits(max_local_depth=3, max_global_resets=1, replay_budget_factor=2.0)


def facts(**overrides: Any) -> FailureFacts:
    """Step 5 failed once, steps 1-4 live, nothing replayed yet."""
    base = FailureFacts(
        failed_step=5,
        category="unique_violation",
        culprit=None,
        dependencies=frozenset(),
        live_steps=(1, 2, 3, 4),
        attempts=1,
        global_resets=0,
        replay_used=0,
        highest_step=5,
    )
    return replace(base, **overrides)


def limits(**overrides: Any) -> PolicyLimits:
    return replace(DEFAULT_LIMITS, **overrides)


def local(n: int, *, resets: int = 0, replay: int = 0) -> Plan:
    return Plan(Strategy.LOCAL_BACKTRACK, (), n, n, False, resets, replay, "")


def jump(to: int, undo: tuple[int, ...], *, resets: int = 0, replay: int) -> Plan:
    return Plan(Strategy.DEPENDENCY_JUMP, undo, to, to, False, resets, replay, "")


def reset(undo: tuple[int, ...], *, resets: int, replay: int) -> Plan:
    return Plan(Strategy.GLOBAL_RESET, undo, 0, 1, True, resets, replay, "")


CASES = [
    # --- culprit jumps, one per category -------------------------------------------------
    pytest.param(
        facts(category="foreign_key_violation", culprit=2),
        DEFAULT_LIMITS,
        jump(2, (4, 3, 2), replay=3),
        id="culprit-fk-jumps-to-culprit",
    ),
    pytest.param(
        facts(category="no_data_found", culprit=3),
        DEFAULT_LIMITS,
        jump(3, (4, 3), replay=2),
        id="culprit-no-data-jumps-to-culprit",
    ),
    pytest.param(
        facts(category="undefined_file", culprit=4),
        DEFAULT_LIMITS,
        jump(4, (4,), replay=1),
        id="culprit-undefined-file-jumps-to-culprit",
    ),
    pytest.param(
        facts(category="foreign_key_violation", culprit=1, replay_used=2),
        DEFAULT_LIMITS,
        jump(1, (4, 3, 2, 1), replay=6),
        id="culprit-jump-adds-to-previous-replay",
    ),
    pytest.param(
        facts(category="foreign_key_violation", culprit=2, live_steps=(1, 2, 4)),
        DEFAULT_LIMITS,
        jump(2, (4, 2), replay=2),
        id="culprit-jump-undoes-only-live-steps",
    ),
    pytest.param(
        facts(category="foreign_key_violation", culprit=3, attempts=9),
        DEFAULT_LIMITS,
        jump(3, (4, 3), replay=2),
        id="culprit-jump-ignores-attempts",
    ),
    # --- a culprit that does not count --------------------------------------------------
    pytest.param(
        facts(category="unique_violation", culprit=2),
        DEFAULT_LIMITS,
        local(5),
        id="culprit-with-other-category-retries-locally",
    ),
    pytest.param(
        facts(category="foreign_key_violation", culprit=3, live_steps=(1, 2, 4)),
        DEFAULT_LIMITS,
        local(5),
        id="non-live-culprit-retries-locally",
    ),
    pytest.param(
        facts(category="no_data_found", culprit=None),
        DEFAULT_LIMITS,
        local(5),
        id="culprit-category-without-culprit-retries-locally",
    ),
    # --- local backtrack, a = 1..depth ----------------------------------------------------
    pytest.param(facts(attempts=1), DEFAULT_LIMITS, local(5), id="local-a1"),
    pytest.param(facts(attempts=2), DEFAULT_LIMITS, local(5), id="local-a2"),
    pytest.param(facts(attempts=3), DEFAULT_LIMITS, local(5), id="local-a3-at-depth"),
    pytest.param(
        facts(attempts=2, dependencies=frozenset({2}), global_resets=1, replay_used=3),
        DEFAULT_LIMITS,
        local(5, resets=1, replay=3),
        id="local-keeps-counters-and-ignores-deps",
    ),
    # --- escalation after depth --------------------------------------------------------
    pytest.param(
        facts(attempts=4, dependencies=frozenset({1, 3})),
        DEFAULT_LIMITS,
        jump(3, (4, 3), replay=2),
        id="escalate-to-nearest-dependency",
    ),
    pytest.param(
        facts(attempts=4, dependencies=frozenset({1, 3}), live_steps=(1, 2, 4)),
        DEFAULT_LIMITS,
        jump(1, (4, 2, 1), replay=3),
        id="escalate-skips-non-live-dependency",
    ),
    pytest.param(
        facts(attempts=4),
        DEFAULT_LIMITS,
        reset((4, 3, 2, 1), resets=1, replay=4),
        id="escalate-to-global-reset-without-deps",
    ),
    pytest.param(
        facts(attempts=4, failed_step=1, live_steps=(), highest_step=1),
        DEFAULT_LIMITS,
        reset((), resets=1, replay=0),
        id="global-reset-with-nothing-live",
    ),
    pytest.param(
        facts(attempts=4, global_resets=1, category="foreign_key_violation"),
        DEFAULT_LIMITS,
        Plan(
            Strategy.ABORT,
            (4, 3, 2, 1),
            0,
            0,
            True,
            1,
            4,
            "global reset limit reached (1 of 1) after step 5 failed: foreign_key_violation",
        ),
        id="reset-becomes-abort-when-resets-exhausted",
    ),
    pytest.param(
        facts(attempts=4, global_resets=1),
        limits(max_global_resets=2),
        reset((4, 3, 2, 1), resets=2, replay=4),
        id="second-reset-allowed-under-limit-2",
    ),
    # --- zero depths ---------------------------------------------------------------------
    pytest.param(
        facts(attempts=1, dependencies=frozenset({2})),
        limits(max_local_depth=0),
        jump(2, (4, 3, 2), replay=3),
        id="depth-0-first-failure-escalates-to-dependency",
    ),
    pytest.param(
        facts(attempts=1, category="undefined_file"),
        limits(max_local_depth=0, max_global_resets=0),
        Plan(
            Strategy.ABORT,
            (4, 3, 2, 1),
            0,
            0,
            True,
            0,
            4,
            "global reset limit reached (0 of 0) after step 5 failed: undefined_file",
        ),
        id="depth-0-resets-0-first-failure-aborts",
    ),
    pytest.param(
        facts(attempts=1, category="foreign_key_violation", culprit=2),
        limits(max_local_depth=0, max_global_resets=0),
        jump(2, (4, 3, 2), replay=3),
        id="depth-0-culprit-still-jumps",
    ),
    # --- replay budget -----------------------------------------------------------------
    pytest.param(
        # budget 2.0 * 5 = 10; 6 + 4 = 10 is exactly the budget.
        facts(attempts=4, replay_used=6),
        DEFAULT_LIMITS,
        reset((4, 3, 2, 1), resets=1, replay=10),
        id="budget-exactly-at-limit-allowed",
    ),
    pytest.param(
        # budget 1.5 * 4 = 6; 4 + 2 = 6 is allowed for a jump too.
        facts(category="no_data_found", culprit=3, replay_used=4, highest_step=4),
        limits(replay_budget_factor=1.5),
        jump(3, (4, 3), replay=6),
        id="budget-jump-exactly-at-limit-allowed",
    ),
    pytest.param(
        facts(attempts=3, replay_used=10),
        DEFAULT_LIMITS,
        local(5, replay=10),
        id="budget-never-stops-a-rollback-that-undoes-nothing",
    ),
]


@pytest.mark.parametrize(("f", "lim", "expected"), CASES)
def test_plan_rollback_follows_spec_table(f: FailureFacts, lim: PolicyLimits, expected: Plan):
    assert plan_rollback(f, lim) == expected


def test_budget_one_over_limit_aborts_with_reason():
    # budget 2.0 * 5 = 10; 7 + 4 = 11 is one over.
    plan = plan_rollback(facts(attempts=4, replay_used=7), DEFAULT_LIMITS)
    assert plan == Plan(
        Strategy.ABORT,
        (4, 3, 2, 1),
        0,
        0,
        True,
        0,
        11,
        "replay budget exhausted after step 5 failed (unique_violation): GLOBAL_RESET would "
        "undo 4 step(s), bringing replay to 11, above the budget of 10 (2 x highest step 5)",
    )


def test_budget_one_over_on_culprit_jump_aborts():
    f = facts(category="foreign_key_violation", culprit=3, replay_used=9)
    plan = plan_rollback(f, DEFAULT_LIMITS)
    assert plan.strategy is Strategy.ABORT
    assert plan.undo == (4, 3, 2, 1)
    assert plan.next_step_id == 0
    assert plan.context_reset is True
    assert "replay budget" in plan.abort_reason
    assert "bringing replay to 11, above the budget of 10" in plan.abort_reason


def test_budget_uses_at_least_one_for_highest_step():
    # highest_step 0 (degenerate) counts as 1: budget 1.0 * 1 = 1.
    at_limit = facts(
        failed_step=2, attempts=4, live_steps=(1,), highest_step=0, dependencies=frozenset({1})
    )
    lim = limits(replay_budget_factor=1.0)
    assert plan_rollback(at_limit, lim) == jump(1, (1,), replay=1)
    over = replace(at_limit, replay_used=1)
    plan = plan_rollback(over, lim)
    assert plan.strategy is Strategy.ABORT
    assert "above the budget of 1 (1 x highest step 1)" in plan.abort_reason


def test_exhausted_resets_take_precedence_over_budget_reason():
    plan = plan_rollback(facts(attempts=4, global_resets=1, replay_used=99), DEFAULT_LIMITS)
    assert plan.strategy is Strategy.ABORT
    assert plan.abort_reason.startswith("global reset limit reached (1 of 1)")


@pytest.mark.parametrize(("f", "lim", "expected"), CASES)
def test_plan_invariants(f: FailureFacts, lim: PolicyLimits, expected: Plan):
    plan = plan_rollback(f, lim)
    assert list(plan.undo) == sorted(plan.undo, reverse=True)
    assert set(plan.undo) <= set(f.live_steps)
    assert plan.context_reset == (plan.strategy in {Strategy.GLOBAL_RESET, Strategy.ABORT})
    assert bool(plan.abort_reason) == (plan.strategy is Strategy.ABORT)
    assert plan.replay_used == f.replay_used + len(plan.undo)
    assert plan.strategy not in {Strategy.NONE, Strategy.MANUAL}


def test_culprit_categories_are_the_three_in_the_spec():
    assert CULPRIT_CATEGORIES == {"foreign_key_violation", "no_data_found", "undefined_file"}


# --- provenance --------------------------------------------------------------------------


def touch(step: int, writes: set[str] | None = None, deletes: set[str] | None = None):
    return StepTouch(step, frozenset(writes or ()), frozenset(deletes or ()))


LIVE = (
    touch(1, writes={"kv:cart", "rec:users:1"}),
    touch(2, writes={"kv:cart"}),
    touch(3, deletes={"kv:token"}),
    touch(4, writes={"fs:notes/a.txt"}),
)


def test_dependencies_last_writer_wins():
    deps = find_dependencies(referenced_steps=(), touched=["kv:cart"], live=LIVE)
    assert deps == frozenset({2})


def test_dependencies_union_refs_and_data_and_deleters():
    deps = find_dependencies(
        referenced_steps=[1], touched=["kv:token", "fs:notes/a.txt", "kv:unknown"], live=LIVE
    )
    assert deps == frozenset({1, 3, 4})


def test_dependencies_ignore_non_live_referenced_step():
    deps = find_dependencies(referenced_steps=[7, 2], touched=[], live=LIVE)
    assert deps == frozenset({2})


def test_dependencies_last_writer_is_by_step_id_not_list_order():
    live = (touch(5, writes={"kv:x"}), touch(2, writes={"kv:x"}))
    assert find_dependencies(referenced_steps=(), touched=["kv:x"], live=live) == {5}


def test_dependencies_empty_when_nothing_relates():
    assert find_dependencies(referenced_steps=(), touched=["kv:other"], live=LIVE) == frozenset()


@pytest.mark.parametrize("category", sorted(CULPRIT_CATEGORIES))
def test_culprit_is_live_referenced_step(category: str):
    got = find_culprit(category=category, offending_ref_step=2, offending_data=None, live=LIVE)
    assert got == 2


def test_culprit_none_for_other_categories():
    got = find_culprit(
        category="unique_violation", offending_ref_step=2, offending_data="kv:token", live=LIVE
    )
    assert got is None


def test_culprit_ignores_non_live_referenced_step():
    got = find_culprit(
        category="foreign_key_violation", offending_ref_step=9, offending_data=None, live=LIVE
    )
    assert got is None


def test_culprit_no_data_found_blames_deleter():
    got = find_culprit(
        category="no_data_found", offending_ref_step=None, offending_data="kv:token", live=LIVE
    )
    assert got == 3


def test_culprit_non_live_ref_falls_back_to_deleter_for_no_data_found():
    got = find_culprit(
        category="no_data_found", offending_ref_step=9, offending_data="kv:token", live=LIVE
    )
    assert got == 3


def test_culprit_deleted_then_rewritten_key_has_no_delete_culprit():
    live = (*LIVE, touch(5, writes={"kv:token"}))
    got = find_culprit(
        category="no_data_found", offending_ref_step=None, offending_data="kv:token", live=live
    )
    assert got is None


def test_culprit_written_then_deleted_blames_the_delete():
    live = (touch(1, writes={"kv:k"}), touch(2, deletes={"kv:k"}))
    got = find_culprit(
        category="no_data_found", offending_ref_step=None, offending_data="kv:k", live=live
    )
    assert got == 2


@pytest.mark.parametrize("category", ["undefined_file", "foreign_key_violation"])
def test_culprit_delete_provenance_only_for_no_data_found(category: str):
    got = find_culprit(
        category=category, offending_ref_step=None, offending_data="kv:token", live=LIVE
    )
    assert got is None


def test_culprit_none_without_provenance():
    got = find_culprit(
        category="no_data_found", offending_ref_step=None, offending_data="kv:never", live=LIVE
    )
    assert got is None
