"""The outcomes benchmark's fault schedule: deterministic per seed, nested across rates,
only where a fault can happen, and each garbled call fails the real argument checks —
AgentTx's and the baselines' own alike."""

from __future__ import annotations

import json

import pytest

from agenttx.args.jsonargs import ArgumentsError, parse_arguments
from agenttx.tools.base import ToolError, validate_arguments
from agenttx.tools.builtin import BUILTIN_TOOLS, KvPut, RecordInsert
from agenttx_bench.outcomes import direct, tasks
from agenttx_bench.outcomes.faults import (
    GARBLES,
    FaultKind,
    FaultSchedule,
    applicable,
    garble,
    typo,
    with_wrong_value,
)
from agenttx_bench.outcomes.oracle import ModelError, apply, expect
from agenttx_bench.outcomes.plan import encode, render_local

SUITE = tasks.suite(30)


def schedule_of(s: FaultSchedule) -> dict[str, dict[int, tuple[str, int]]]:
    return {t.name: {i: (f.kind.value, f.variant) for i, f in s.for_task(t.name).items()}
            for t in SUITE}


def test_the_same_seed_gives_the_same_fault_schedule():
    a, b = FaultSchedule(7, 0.3, SUITE), FaultSchedule(7, 0.3, tasks.suite(30))
    assert schedule_of(a) == schedule_of(b)
    assert schedule_of(a)["order-00"] == schedule_of(b)["order-00"]


def test_another_seed_gives_another_schedule():
    assert schedule_of(FaultSchedule(7, 0.3, SUITE)) != schedule_of(FaultSchedule(8, 0.3, SUITE))


def test_the_schedule_does_not_depend_on_the_run_namespace():
    here = FaultSchedule(7, 0.3, tasks.suite(30, "run0001/"))
    assert schedule_of(here) == schedule_of(FaultSchedule(7, 0.3, SUITE))


def test_faults_at_a_lower_rate_are_a_subset_of_those_at_a_higher_one():
    low, mid, high = (schedule_of(FaultSchedule(3, p, SUITE)) for p in (0.1, 0.3, 0.5))
    for name in low:
        assert low[name].items() <= mid[name].items() <= high[name].items()


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_the_share_of_faulty_calls_is_close_to_p(p):
    suite = tasks.suite(600)
    calls = sum(len(t.ops) for t in suite)
    faults = len(FaultSchedule(11, p, suite).all())
    assert abs(faults / calls - p) < 0.03


def test_every_fault_is_one_that_can_happen_at_its_call_and_every_kind_occurs():
    s = FaultSchedule(1, 0.5, SUITE)
    by_name = {t.name: t for t in SUITE}
    for f in s.all():
        assert f.kind in applicable(by_name[f.task], f.op_index)
    assert all(n > 0 for n in s.counts().values()), s.counts()
    assert set(s.counts()) == {k.value for k in FaultKind}


def test_no_faults_at_rate_zero():
    assert FaultSchedule(1, 0.0, SUITE).all() == []


@pytest.mark.parametrize("variant, message", [
    (0, "unknown field `kye`, expected one of `key`, `value`"),
    (1, "EOF while parsing an object at line 1 column 28"),
    (2, "missing field `key`"),
])
def test_a_garbled_call_fails_the_real_argument_checks(variant, message):
    text = encode({"key": "run0001/a", "value": 1})
    bad = garble(text, variant)
    with pytest.raises((ArgumentsError, ToolError)) as err:
        validate_arguments(parse_arguments(bad), KvPut.fields)
    assert str(err.value) == message
    assert GARBLES[variant]


def test_a_garbled_first_argument_of_a_record_insert_is_named():
    text = encode({"table": "orders", "id": "run0001/o-1", "fields": {}})
    with pytest.raises(ToolError) as err:
        validate_arguments(parse_arguments(garble(text, 0)), RecordInsert.fields)
    assert str(err.value).startswith("unknown field `tbale`")


def test_a_mistyped_id_is_no_id_of_the_suite():
    assert typo("run0001/c-3") == "run0001/cc-3"
    ids: set[str] = set()
    for t in tasks.suite(30, "run0001/"):
        exp = expect(t)
        ids |= {rid for _, rid in exp.primary.rows} | set(exp.primary.kv)
    assert not {typo(i) for i in ids} & ids


@pytest.mark.parametrize("task", [t for t in SUITE if any(op.wrong for op in t.ops)],
                         ids=lambda t: t.name)
def test_a_wrong_value_is_found_later_as_a_missing_row(task):
    """Every `wrong` op feeds a later op that fails on the mistyped id (FK or lookup)."""
    state, outputs = task.initial.copy(), {}
    found = None
    poisoned = False
    for op in task.ops:
        text = encode(render_local(op.args, outputs))
        if op.wrong and not poisoned:
            text, poisoned = with_wrong_value(text, op.wrong), True
        try:
            outputs[op.label] = apply(state, op.tool, json.loads(text))
        except ModelError as exc:
            found = str(exc)
            break
    assert found is not None and ("not in" in found or "no row" in found), found


def _planned_calls():
    """(task, op, the JSON the agent emits) for every planned call of the suite."""
    for task in tasks.suite(30, "run0001/"):
        state, outputs = task.initial.copy(), {}
        for op in task.ops:
            args = render_local(op.args, outputs)
            outputs[op.label] = apply(state, op.tool, args)
            yield task, op, encode(args)


BUILTINS = {cls.name: cls for cls in BUILTIN_TOOLS}


def _agenttx_accepts(tool: str, text: str) -> bool:
    try:
        validate_arguments(parse_arguments(text), BUILTINS[tool].fields)
    except (ArgumentsError, ToolError):
        return False
    return True


def _baseline_accepts(tool: str, text: str) -> bool:
    try:
        direct.parse_arguments(tool, text)
    except direct.ToolFailure:
        return False
    return True


def test_the_baselines_accept_every_clean_call_and_refuse_every_garbled_one_as_agenttx_does():
    """A transient fault must fail on every system alike: the baselines' own argument
    checks agree with AgentTx's on every planned call and every way of garbling it."""
    checked = 0
    for task, op, text in _planned_calls():
        assert _agenttx_accepts(op.tool, text), (task.name, op.label)
        assert _baseline_accepts(op.tool, text), (task.name, op.label)
        for variant in range(len(GARBLES)):
            bad = garble(text, variant)
            assert not _agenttx_accepts(op.tool, bad), (task.name, op.label, variant)
            assert not _baseline_accepts(op.tool, bad), (task.name, op.label, variant)
            checked += 1
    assert checked == 3 * sum(len(t.ops) for t in SUITE)


@pytest.mark.parametrize("tool, text, message", [
    ("kv.put", '{"key": "a", "value": 1', "Expecting ',' delimiter at line 1 column 24"),
    ("kv.put", '[1]', "invalid type: list, expected a map"),
    ("kv.get", '{"kye": "a"}', "unknown field `kye`, expected one of `key`"),
    ("fs.write", '{"path": "a"}', "missing field `contents`"),
    ("kv.get", '{"key": 5}', "key: invalid type: 5, expected a string"),
    ("record.get", '{"table": "t", "id": true}', "id: invalid type: true, expected a string or number"),
    ("record.get", '{"table": "no-dash", "id": 1}',
     'table: invalid value: "no-dash", expected a name matching [A-Za-z0-9_]{1,128}'),
    ("kv.scan", '{}', "unknown tool kv.scan; tools: effect.stage, fs.read, fs.write, kv.delete, "
     "kv.get, kv.put, record.get, record.insert"),
])
def test_the_baselines_say_what_is_wrong_with_a_call(tool, text, message):
    with pytest.raises(direct.ToolFailure) as err:
        direct.parse_arguments(tool, text)
    assert str(err.value) == message


def test_the_baselines_fill_in_absent_optional_arguments():
    assert direct.parse_arguments("effect.stage", '{"channel": "webhook"}') == \
        {"channel": "webhook", "payload": None, "idempotency_key": None}
    assert direct.parse_arguments("record.insert", '{"table": "t", "id": 7}') == \
        {"table": "t", "id": 7, "fields": None, "references": None}
