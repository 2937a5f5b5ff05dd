"""The rollback planner: which steps to undo after a failed step, and what to send next.

The planner of docs/recovery.md#4-the-planner is implemented here and nowhere else. The planner
is a pure function over plain data — no I/O, no clock, no grpc or etcd types — for two reasons:

* it is the part of AgentTx whose behaviour users reason about ("why did it jump back to
  step 2?"), so it must be readable and testable in isolation, branch by branch, without
  a server or an etcd;
* service replicas are stateless: whichever replica handles the failing step plans from
  the facts it read from etcd, and any replica planning from the same facts reaches the
  same plan.

The engine gathers the facts (`FailureFacts`, using `find_dependencies` and
`find_culprit` for provenance), calls `plan_rollback`, then carries the plan out. This
module never undoes anything itself, and it never returns `Strategy.MANUAL`: MANUAL is
what the engine records when an undo action the plan asked for fails (docs/recovery.md#4-the-planner) or when
the agent asks for a rollback explicitly.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class Strategy(enum.Enum):
    """Rollback strategies; values are the proto enum names without `ROLLBACK_STRATEGY_`."""

    NONE = "NONE"
    LOCAL_BACKTRACK = "LOCAL_BACKTRACK"
    DEPENDENCY_JUMP = "DEPENDENCY_JUMP"
    GLOBAL_RESET = "GLOBAL_RESET"
    MANUAL = "MANUAL"
    ABORT = "ABORT"


# Error categories whose offending value can be traced to the step that produced it
# (docs/recovery.md#3-dependencies-and-provenance). Only for these does a culprit short-circuit
# the local retries.
CULPRIT_CATEGORIES = frozenset({"foreign_key_violation", "no_data_found", "undefined_file"})


@dataclass(frozen=True)
class FailureFacts:
    """Everything the planner needs to know about one step failure."""

    failed_step: int  # n, the step id that just failed (n == next_step_id)
    category: str  # error_category from the cleaner
    culprit: int | None  # live step j < n that produced the offending value (find_culprit)
    dependencies: frozenset[int]  # live steps j < n that step n depends on (find_dependencies)
    live_steps: tuple[int, ...]  # ascending ids of live (applied, not undone) steps; all < n
    attempts: int  # a: failed attempts at step n since it last became next, this one included
    global_resets: int  # global resets already done in this transaction
    replay_used: int  # steps undone so far by automatic rollbacks in this transaction
    highest_step: int  # highest step id reached so far (>= n)


@dataclass(frozen=True)
class PolicyLimits:
    """The rollback half of a transaction's effective policy."""

    max_local_depth: int
    max_global_resets: int
    replay_budget_factor: float


@dataclass(frozen=True)
class Plan:
    """What the engine must do, and what it tells the agent."""

    strategy: Strategy
    undo: tuple[int, ...]  # live step ids to undo, in undo order (descending)
    rollback_to_step: int  # first undone step; n for LOCAL_BACKTRACK; 0 for GLOBAL_RESET/ABORT
    next_step_id: int  # the step the agent sends next; 0 for ABORT
    context_reset: bool  # True for GLOBAL_RESET and ABORT
    global_resets: int  # new value (incremented by GLOBAL_RESET)
    replay_used: int  # new value: old + len(undo)
    abort_reason: str  # non-empty only for ABORT


def plan_rollback(facts: FailureFacts, limits: PolicyLimits) -> Plan:
    """Choose the rollback for failed step `facts.failed_step` (docs/recovery.md#4-the-planner).

    In order:
      1. a culprit category with a live culprit j -> DEPENDENCY_JUMP to j;
      2. attempts <= max_local_depth -> LOCAL_BACKTRACK (retry step n, nothing undone);
      3. otherwise DEPENDENCY_JUMP to the nearest (highest) live dependency, or a
         GLOBAL_RESET when there is none — or ABORT when the resets are used up;
      4. any rollback whose undo would take the replay count above
         replay_budget_factor * max(1, highest_step) becomes ABORT instead.

    ABORT undoes every live step, and its `replay_used` is old + len(undo) like any other
    plan (the transaction ends, so the value is only informative). A rollback that undoes
    nothing adds no replay and is never stopped by the budget.
    """
    n = facts.failed_step
    live = facts.live_steps
    culprit = facts.culprit if facts.culprit in live else None

    if facts.category in CULPRIT_CATEGORIES and culprit is not None:
        return _budgeted(_jump(facts, culprit), facts, limits)

    if facts.attempts <= limits.max_local_depth:
        return Plan(
            strategy=Strategy.LOCAL_BACKTRACK,
            undo=(),
            rollback_to_step=n,
            next_step_id=n,
            context_reset=False,
            global_resets=facts.global_resets,
            replay_used=facts.replay_used,
            abort_reason="",
        )

    live_deps = [d for d in facts.dependencies if d in live]
    if live_deps:
        return _budgeted(_jump(facts, max(live_deps)), facts, limits)

    # `>=` rather than `==` keeps the function total if a policy's limit was lowered.
    if facts.global_resets >= limits.max_global_resets:
        return _abort(
            facts,
            f"global reset limit reached ({facts.global_resets} of "
            f"{limits.max_global_resets}) after step {n} failed: {facts.category}",
        )
    reset = Plan(
        strategy=Strategy.GLOBAL_RESET,
        undo=_descending(live),
        rollback_to_step=0,
        next_step_id=1,
        context_reset=True,
        global_resets=facts.global_resets + 1,
        replay_used=facts.replay_used + len(live),
        abort_reason="",
    )
    return _budgeted(reset, facts, limits)


def _descending(steps: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(steps, reverse=True))


def _jump(facts: FailureFacts, target: int) -> Plan:
    undo = _descending(s for s in facts.live_steps if s >= target)
    return Plan(
        strategy=Strategy.DEPENDENCY_JUMP,
        undo=undo,
        rollback_to_step=target,
        next_step_id=target,
        context_reset=False,
        global_resets=facts.global_resets,
        replay_used=facts.replay_used + len(undo),
        abort_reason="",
    )


def _budgeted(plan: Plan, facts: FailureFacts, limits: PolicyLimits) -> Plan:
    """Return `plan`, or ABORT if its undo would take replay above the budget (the replay
    budget: docs/recovery.md#4-the-planner)."""
    if not plan.undo:
        return plan
    highest = max(1, facts.highest_step)
    budget = limits.replay_budget_factor * highest
    if plan.replay_used <= budget:
        return plan
    return _abort(
        facts,
        f"replay budget exhausted after step {facts.failed_step} failed "
        f"({facts.category}): {plan.strategy.value} would undo {len(plan.undo)} step(s), "
        f"bringing replay to {plan.replay_used}, above the budget of {budget:g} "
        f"({limits.replay_budget_factor:g} x highest step {highest})",
    )


def _abort(facts: FailureFacts, reason: str) -> Plan:
    undo = _descending(facts.live_steps)
    return Plan(
        strategy=Strategy.ABORT,
        undo=undo,
        rollback_to_step=0,
        next_step_id=0,
        context_reset=True,
        global_resets=facts.global_resets,
        replay_used=facts.replay_used + len(undo),
        abort_reason=reason,
    )


# --- provenance -------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTouch:
    """What one live step did to data, for provenance."""

    step_id: int
    writes: frozenset[str]  # data ids written ("kv:cart", "rec:orders:7", "fs:notes/a.txt")
    deletes: frozenset[str]  # data ids deleted (kv.delete)


def _last_toucher(data_id: str, live: Sequence[StepTouch]) -> StepTouch | None:
    """The highest-numbered live step that wrote or deleted `data_id`, if any."""
    best: StepTouch | None = None
    for touch in live:
        if data_id in touch.writes or data_id in touch.deletes:
            if best is None or touch.step_id > best.step_id:
                best = touch
    return best


def find_dependencies(
    *, referenced_steps: Iterable[int], touched: Iterable[str], live: Sequence[StepTouch]
) -> frozenset[int]:
    """Live steps the failed step depends on (docs/recovery.md#3-dependencies-and-provenance).

    That is every live step named by a `${steps.j…}` reference, plus, for each data id
    the failed step touches (reads, writes, foreign-key targets, file paths), the live
    step that last wrote or deleted it. Referenced steps that are not live are ignored.
    """
    live_ids = {t.step_id for t in live}
    deps = {s for s in referenced_steps if s in live_ids}
    for data_id in touched:
        last = _last_toucher(data_id, live)
        if last is not None:
            deps.add(last.step_id)
    return frozenset(deps)


def find_culprit(
    *,
    category: str,
    offending_ref_step: int | None,
    offending_data: str | None,
    live: Sequence[StepTouch],
) -> int | None:
    """The live step that produced the value step n choked on, or None
    (docs/recovery.md#3-dependencies-and-provenance).

    Only for the culprit categories. First choice: the live step whose output reached
    the offending argument through a `${steps.j…}` reference. Otherwise, for
    `no_data_found` only: the live step that deleted `offending_data`, provided it is the
    last live step to touch it (a later re-write means the delete is not to blame). A step
    that both wrote and deleted the id is ambiguous and is not blamed. No provenance, no
    culprit: a guess that undoes good work is worse than a retry.
    """
    if category not in CULPRIT_CATEGORIES:
        return None
    if offending_ref_step is not None and any(t.step_id == offending_ref_step for t in live):
        return offending_ref_step
    if category == "no_data_found" and offending_data is not None:
        last = _last_toucher(offending_data, live)
        if last is not None and offending_data in last.deletes:
            if offending_data not in last.writes:
                return last.step_id
    return None
