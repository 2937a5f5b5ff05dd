"""The outcomes benchmark's oracle: fed final states that are right, wrong, incomplete,
with a duplicate or a leaked effect, it says so."""

from __future__ import annotations

from dataclasses import replace

from agenttx_bench.outcomes import tasks
from agenttx_bench.outcomes.oracle import ExternalWrite, Outcome, expect, judge, simulate
from agenttx_bench.outcomes.state import Delivered, State, digest

NS = "run0042/"


def order_task() -> tasks.Task:
    return tasks.build(0, NS)  # order-00: order, 2 line items, stock, invoice, confirmation


def test_the_planned_final_state_is_correct_and_hashes_to_the_expected_sha():
    task = order_task()
    exp = expect(task)
    verdict = judge(exp.primary.copy(), exp, NS)
    assert verdict.outcome is Outcome.CORRECT
    assert verdict.final_sha256 == verdict.expected_sha256
    assert (verdict.duplicate_effects, verdict.leaked_effects) == (0, 0)


def test_a_wrong_committed_value_is_corrupt():
    task = order_task()
    exp = expect(task)
    final = exp.primary.copy()
    final.kv[f"{NS}stock/sku-0-a"] -= 1  # one unit too many taken
    verdict = judge(final, exp, NS)
    assert verdict.outcome is Outcome.CORRUPT
    assert verdict.final_sha256 != verdict.expected_sha256
    assert verdict.expected_sha256 == digest(exp.primary, NS)


def test_a_duplicate_delivery_is_counted_and_makes_the_state_corrupt():
    task = order_task()
    exp = expect(task)
    final = exp.primary.copy()
    key = f"{NS}o-0/confirmed"
    once = final.effects[key]
    final.effects[key] = replace(once, payloads=once.payloads * 2)
    verdict = judge(final, exp, NS)
    assert verdict.outcome is Outcome.CORRUPT
    assert verdict.duplicate_effects == 1
    assert verdict.leaked_effects == 0  # the work it announces was committed


def test_an_effect_for_work_that_was_not_committed_is_leaked():
    task = order_task()
    exp = expect(task)
    final = exp.untouched.copy()  # nothing committed ...
    key = f"{NS}o-0/confirmed"
    final.effects[key] = exp.primary.effects[key]  # ... but the confirmation went out
    verdict = judge(final, exp, NS)
    assert verdict.outcome is Outcome.CORRUPT
    assert (verdict.duplicate_effects, verdict.leaked_effects) == (0, 1)


def test_an_effect_with_another_payload_is_leaked():
    task = order_task()
    exp = expect(task)
    final = exp.primary.copy()
    key = f"{NS}o-0/confirmed"
    final.effects[key] = Delivered("webhook", ({"event": "order_confirmed", "order": "o-9"},))
    assert judge(final, exp, NS).leaked_effects == 1


def test_a_clean_abort_is_partial():
    task = order_task()
    exp = expect(task)
    verdict = judge(exp.untouched.copy(), exp, NS)
    assert verdict.outcome is Outcome.PARTIAL
    assert (verdict.duplicate_effects, verdict.leaked_effects) == (0, 0)


def test_half_an_atomic_group_is_corrupt():
    task = order_task()
    exp = expect(task)
    final = exp.untouched.copy()
    order = ("orders", f"{NS}o-0")
    final.rows[order] = exp.primary.rows[order]  # the order without its line items
    assert judge(final, exp, NS).outcome is Outcome.CORRUPT


def test_one_whole_ticket_of_two_is_partial_and_half_a_ticket_is_corrupt():
    task = tasks.build(1, NS)  # triage-00: two tickets, one group each
    exp = expect(task)
    first_ticket = {item for item, group in exp.groups.items() if group == 0}
    want, final = exp.primary.as_map(), exp.untouched.copy()
    for kind, *rest in first_ticket:
        if kind == "kv":
            final.kv[rest[0]] = want[(kind, *rest)]
        elif kind == "row":
            final.rows[(rest[0], rest[1])] = want[(kind, *rest)]
        elif kind == "effect":
            final.effects[rest[0]] = exp.primary.effects[rest[0]]
    assert judge(final, exp, NS).outcome is Outcome.PARTIAL
    del final.rows[("assignments", f"{NS}T-0-1")]
    assert judge(final, exp, NS).outcome is Outcome.CORRUPT


def test_a_lost_update_matches_no_serial_order_but_both_serial_orders_are_correct():
    task = tasks.build(2, NS)  # move-00: moves stock between two counters
    src = f"{NS}stock/wh-a/sku-0"
    writer = [ExternalWrite(src, -2)]  # another agent took 2 units meanwhile
    exp = expect(task, writer)
    theirs_first, _ = simulate(task, before=writer)
    ours_first, _ = simulate(task, after=writer)
    assert judge(theirs_first, exp, NS).outcome is Outcome.CORRECT
    assert judge(ours_first, exp, NS).outcome is Outcome.CORRECT
    lost, _ = simulate(task)  # what a read-modify-write without isolation leaves
    assert lost.kv[src] == theirs_first.kv[src] + 2
    assert judge(lost, exp, NS).outcome is Outcome.CORRUPT


def test_the_hash_does_not_depend_on_the_run_namespace():
    a, b = expect(tasks.build(3, "run0001/")), expect(tasks.build(3, "run0999/"))
    assert digest(a.primary, "run0001/") == digest(b.primary, "run0999/")
    assert digest(a.primary, "run0001/") != digest(b.primary, "run0001/")


def test_an_extra_row_is_corrupt():
    task = order_task()
    exp = expect(task)
    final: State = exp.primary.copy()
    final.rows[("orders", f"{NS}o-7")] = {"customer_id": f"{NS}c-0", "total": 1}
    assert judge(final, exp, NS).outcome is Outcome.CORRUPT
