"""What the outcomes benchmark reads back after a run: every item a task can leave
behind, so that reading AgentTx item by item through its client (it cannot list keys)
misses nothing a scan of storage would have found."""

from __future__ import annotations

import dataclasses

import pytest

from agenttx_bench.outcomes import tasks
from agenttx_bench.outcomes.dump import Items, items_of, reads
from agenttx_bench.outcomes.oracle import ExternalWrite, expect
from agenttx_bench.outcomes.plan import Calc, Op, Ref
from agenttx_bench.outcomes.state import State

SUITE = tasks.suite(30, "run0001/")


def _covered(state: State, items: Items) -> None:
    assert set(state.kv) <= set(items.kv)
    assert set(state.rows) <= set(items.rows)
    assert set(state.files) <= set(items.files)


@pytest.mark.parametrize("task", SUITE, ids=lambda t: t.name)
def test_the_items_cover_every_correct_and_untouched_state(task):
    counters = [op.args["key"] for op in task.ops if op.conflict_delta is not None]
    exp = expect(task, [ExternalWrite(k, 1) for k in counters])
    items = items_of(task)
    for state in (*exp.correct, exp.untouched, task.initial):
        _covered(state, items)


def test_the_items_are_exactly_the_initial_ones_plus_the_plans_write_targets():
    task = tasks.build(2, "run0001/")  # move-00
    assert items_of(task) == Items(
        kv=("run0001/moves/draft-m-0", "run0001/stock/wh-a/sku-0", "run0001/stock/wh-b/sku-0"),
        rows=(("moves", "run0001/m-0"), ("products", "run0001/sku-0"),
              ("products", "run0001/sku-50")),
        files=("run0001/manifests/m-0.txt", "run0001/requests/move.json"))


def test_a_wrong_value_never_moves_a_write_to_another_item():
    """The wrong_value fault mistypes a value the agent derives; the items stay the
    plan's, so a row written under a mistyped id could not escape the read-back."""
    wrong = [(t.name, op) for t in SUITE for op in t.ops if op.wrong]
    assert wrong
    for name, op in wrong:
        assert op.wrong is not None
        assert op.wrong[0] not in ("key", "table", "id", "path"), (name, op.label)


def test_a_plan_whose_write_target_is_derived_is_refused():
    task = tasks.build(2, "run0001/")
    derived = Op("copy", "kv.put", {"key": Ref("draft", "value.sku"), "value": 1})
    computed = Op("calc", "fs.write", {"path": Calc(lambda o: "x"), "contents": ""})
    for op in (derived, computed):
        bad = dataclasses.replace(task, ops=(*task.ops, op))
        with pytest.raises(ValueError, match=f"op {op.label}: {op.tool} writes to a target"):
            items_of(bad)


def test_one_read_per_item_kv_then_rows_then_files():
    items = Items(kv=("a",), rows=(("t", "1"),), files=("f.txt",))
    assert reads(items) == [("kv.get", {"key": "a"}),
                            ("record.get", {"table": "t", "id": "1"}),
                            ("fs.read", {"path": "f.txt"})]
