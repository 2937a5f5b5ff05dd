"""`${steps.N.path}` references (docs/tools.md#the-built-ins, seed 002): a whole-string
reference keeps the JSON type, an embedded one interpolates as text, dotted paths index objects
and arrays, and only live steps can be referenced."""

from __future__ import annotations

import pytest

from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import expect_failure, output
from support.service import Agent

VALUE = {"n": 5, "f": 2.5, "s": "text", "obj": {"a": 1, "b": [True, None]},
         "list": [10, "twenty", {"x": "y"}], "yes": True, "no": False, "nothing": None,
         "dotted key": "spaced"}


@pytest.fixture
def seeded(agent, uniq) -> Agent:
    """Step 1 is a kv.put whose output holds one value of every JSON type."""
    agent.ok("kv.put", {"key": f"src-{uniq}", "value": VALUE})
    return agent


@pytest.mark.parametrize(("ref", "expected"), [
    ("${steps.1.value.n}", 5),
    ("${steps.1.value.f}", 2.5),
    ("${steps.1.value.s}", "text"),
    ("${steps.1.value.obj}", {"a": 1, "b": [True, None]}),
    ("${steps.1.value.list}", [10, "twenty", {"x": "y"}]),
    ("${steps.1.value.yes}", True),
    ("${steps.1.value.no}", False),
    ("${steps.1.value.nothing}", None),
    ("${steps.1.value}", VALUE),
    ("${steps.1}", {"key": "<key>", "value": VALUE}),
])
def test_a_whole_string_reference_keeps_the_json_type(seeded, uniq, ref, expected):
    if isinstance(expected, dict) and "key" in expected:
        expected = {"key": f"src-{uniq}", "value": VALUE}
    got = seeded.ok("kv.put", {"key": f"dst-{uniq}", "value": ref})
    assert got == {"key": f"dst-{uniq}", "value": expected}
    assert type(got["value"]) is type(expected)
    # the stored value is the typed one, too
    assert seeded.ok("kv.get", {"key": f"dst-{uniq}"})["value"] == expected


@pytest.mark.parametrize(("template", "expected"), [
    ("n=${steps.1.value.n}", "n=5"),
    ("${steps.1.value.s}!", "text!"),
    ("${steps.1.value.n}${steps.1.value.s}", "5text"),
    ("obj=${steps.1.value.obj}", 'obj={"a":1,"b":[true,null]}'),
    ("list=${steps.1.value.list}", 'list=[10,"twenty",{"x":"y"}]'),
    ("${steps.1.value.yes}/${steps.1.value.nothing}", "true/null"),
    ("f=${steps.1.value.f}", "f=2.5"),
])
def test_an_embedded_reference_interpolates_as_text(seeded, uniq, template, expected):
    assert seeded.ok("kv.put", {"key": f"dst-{uniq}", "value": template})["value"] == expected


@pytest.mark.parametrize(("ref", "expected"), [
    ("${steps.1.value.obj.a}", 1),
    ("${steps.1.value.obj.b.0}", True),
    ("${steps.1.value.obj.b.1}", None),
    ("${steps.1.value.list.0}", 10),
    ("${steps.1.value.list.2.x}", "y"),
    ("${steps.1.value.dotted key}", "spaced"),
])
def test_dotted_paths_index_objects_and_arrays(seeded, uniq, ref, expected):
    assert seeded.ok("kv.put", {"key": f"dst-{uniq}", "value": ref})["value"] == expected


def test_references_work_in_keys_nested_arguments_and_across_replicas(seeded, b, uniq):
    # the key to read comes from step 1's output (not prefetchable: resolved at run time)
    assert seeded.ok("kv.get", {"key": "${steps.1.key}"}, stub=b)["value"] == VALUE
    table = f"t_{uniq}"
    row = seeded.ok("record.insert", {"table": table, "id": "${steps.1.value.n}",
                                      "fields": {"label": "${steps.1.value.s}",
                                                 "items": ["${steps.1.value.list.1}", 3]}})
    assert row == {"table": table, "id": 5, "fields": {"label": "text", "items": ["twenty", 3]}}
    assert seeded.ok("record.get", {"table": "${steps.3.table}", "id": "${steps.3.id}"},
                     stub=b)["fields"] == row["fields"]


@pytest.mark.parametrize("ref", ["${steps.9.key}", "${steps.0.key}", "${steps.2.value}",
                                 "before ${steps.7} after"])
def test_a_reference_to_a_step_that_is_not_live_is_undefined_object(seeded, uniq, ref):
    step = ref.split("steps.")[1].split(".")[0].split("}")[0]
    resp = seeded.step("kv.put", {"key": f"dst-{uniq}", "value": ref})
    expect_failure(resp, "undefined_object", step)
    assert resp.next_step_id == 2


@pytest.mark.parametrize(("ref", "path"), [
    ("${steps.1.value.missing}", "value.missing"),
    ("${steps.1.value.list.3}", "value.list.3"),
    ("${steps.1.value.list.x}", "value.list.x"),
    ("${steps.1.value.n.deeper}", "value.n.deeper"),
    ("${steps.1.nokey}", "nokey"),
    ("embedded ${steps.1.value.obj.zz} text", "value.obj.zz"),
])
def test_a_missing_path_is_undefined_column(seeded, uniq, ref, path):
    resp = seeded.step("kv.put", {"key": f"dst-{uniq}", "value": ref})
    expect_failure(resp, "undefined_column", path, "1")


def test_a_reference_to_a_step_undone_by_rollback_fails(agent, uniq):
    agent.ok("kv.put", {"key": f"a-{uniq}", "value": "one"})
    agent.ok("kv.put", {"key": f"b-{uniq}", "value": "two"})
    agent.ok("kv.put", {"key": f"c-{uniq}", "value": "three"})
    assert agent.rollback(to_step=2).next_step_id == 2
    for ref in ("${steps.2.value}", "${steps.3.value}"):
        resp = agent.step("kv.put", {"key": f"d-{uniq}", "value": ref})
        expect_failure(resp, "undefined_object", ref[8])
        assert resp.status == pb.STEP_STATUS_ROLLBACK_TRIGGERED
    assert output(agent.step("kv.put", {"key": f"d-{uniq}", "value": "${steps.1.value}"})) == \
        {"key": f"d-{uniq}", "value": "one"}
    # the new step 2 is live and referenceable again
    assert agent.ok("kv.put", {"key": f"e-{uniq}", "value": "${steps.2.value}"})["value"] == "one"


@pytest.mark.parametrize("shape", ["embedded", "whole-in-list", "whole-in-object"])
def test_references_that_would_amplify_the_arguments_hit_a_limit(a, uniq, shape):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"big-{uniq}", "value": "x" * 200_000})
    ref = "${steps.1.value}"
    value = {"embedded": ref * 5000, "whole-in-list": [ref] * 5000,
             "whole-in-object": {f"f{i}": ref for i in range(5000)}}[shape]
    resp = agent.step("kv.put", {"key": f"amp-{uniq}", "value": value})
    expect_failure(resp, "program_limit_exceeded", "Limit exceeded")
    # the replica is fine and the transaction goes on
    assert agent.ok("kv.put", {"key": f"amp-{uniq}", "value": [ref] * 10})["value"] == \
        ["x" * 200_000] * 10


def test_non_ascii_digits_are_not_step_numbers_or_indexes(seeded, uniq):
    # "٣" (ARABIC-INDIC DIGIT THREE) is not a step number: the text is kept as is
    assert seeded.ok("kv.put", {"key": f"d-{uniq}", "value": "${steps.٣.key}"})["value"] == \
        "${steps.٣.key}"
    expect_failure(seeded.step("kv.put", {"key": f"d-{uniq}", "value": "${steps.1.value.list.²}"}),
                   "undefined_column", "value.list.²")
