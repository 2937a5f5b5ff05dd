"""The outcomes benchmark's task suite: at least 30 multi-step tasks with a known final
state, all six families, every fault kind possible somewhere, and plans whose references
AgentTx can trace."""

from __future__ import annotations

from collections import Counter

from agenttx_bench.outcomes import tasks
from agenttx_bench.outcomes.faults import FaultKind, applicable
from agenttx_bench.outcomes.oracle import expect
from agenttx_bench.outcomes.plan import Ref, encode, render_agenttx, render_local

SUITE = tasks.suite(30)


def test_thirty_distinct_tasks_five_of_each_family():
    assert len({t.name for t in SUITE}) == 30
    assert Counter(t.family for t in SUITE) == {f: 5 for f in tasks.FAMILIES}


def test_every_task_is_multi_step_and_has_a_known_final_state():
    for task in SUITE:
        assert len(task.ops) >= 9, task.name
        exp = expect(task)  # the model runs the plan; it raises if the plan is inconsistent
        assert exp.primary.as_map() != exp.untouched.as_map()
        assert exp.primary.effects, f"{task.name} sends no effect"


def test_every_fault_kind_can_happen_in_the_suite():
    kinds = {k for t in SUITE for i in range(len(t.ops)) for k in applicable(t, i)}
    assert kinds == set(FaultKind)


def test_names_stay_inside_the_run_namespace():
    task = tasks.build(4, "run0001/")
    exp = expect(task)
    assert all(k.startswith("run0001/") for k in exp.primary.kv)
    assert all(rid.startswith("run0001/") for _, rid in exp.primary.rows)
    assert all(p.startswith("run0001/") for p in exp.primary.files)
    assert all(k.startswith("run0001/") for k in exp.primary.effects)


def test_agenttx_gets_step_references_where_a_baseline_gets_values():
    task = tasks.build(0, "run0001/")  # order-00
    step_of = {op.label: k + 1 for k, op in enumerate(task.ops)}
    order = task.op("order")
    assert render_agenttx(order.args, {}, step_of)["fields"]["customer_id"] == \
        "${steps.2.value.customer}"
    invoice = render_agenttx(task.op("invoice").args, {}, step_of)["contents"]
    assert invoice.startswith("INVOICE ${steps.3.id}\ncustomer: ${steps.2.value.customer}\n")
    outputs = {"draft": {"value": {"customer": "run0001/c-0", "total": 54}}}
    assert render_local(order.args, outputs)["fields"]["customer_id"] == "run0001/c-0"
    readback = task.op("readback")
    assert isinstance(readback.args["path"], Ref)
    assert encode(render_agenttx(readback.args, {}, step_of)) == '{"path":"${steps.10.path}"}'


def test_the_suite_cycles_for_more_tasks():
    big = tasks.suite(45)
    assert [t.family for t in big[30:36]] == list(tasks.FAMILIES)
    assert big[30].name == "order-05"
