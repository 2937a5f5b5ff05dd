"""`agenttx.args.refs`: `${steps.N.path}` references (SPEC §3, seed 002) and the facts the
engine's rollback rules need from them (SPEC §5, issue 9 item 2).

A whole-string reference keeps the JSON type, an embedded one interpolates as text,
dotted paths index objects and arrays, only live steps can be referenced; every live step
the document references is a dependency even when another reference fails; a culprit is
found through whole-object references. The cases of tests/integration/test_references.py
are here against the pure functions, with the exact raw messages. Pure: no I/O.
"""

from __future__ import annotations

import copy
import json

import pytest

from agenttx.args import (
    MAX_DEPTH,
    MAX_EXPANSION,
    OverBudget,
    Reference,
    ReferenceError_,
    Resolution,
    find_references,
    has_reference,
    offending_step,
    parse_arguments,
    resolve,
)
from agenttx.cleaner import clean_error

VALUE = {"n": 5, "f": 2.5, "s": "text", "obj": {"a": 1, "b": [True, None]},
         "list": [10, "twenty", {"x": "y"}], "yes": True, "no": False, "nothing": None,
         "dotted key": "spaced"}
STEP_1 = {"key": "src", "value": VALUE}
OUTPUTS = {1: STEP_1}
LIVE = range(1, 2)


def resolved(value: object, outputs: dict[int, object] | None = None, live: range = LIVE) -> object:
    return resolve({"value": value}, OUTPUTS if outputs is None else outputs, live).value["value"]


def failure(args: object, outputs: dict[int, object] | None = None,
            live: range = LIVE) -> ReferenceError_:
    with pytest.raises(ReferenceError_) as info:
        resolve(args, OUTPUTS if outputs is None else outputs, live)
    return info.value


# ---- resolving ----------------------------------------------------------------------------

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
    ("${steps.1}", STEP_1),
    ("${steps.01.key}", "src"),
])
def test_a_whole_string_reference_keeps_the_json_type(ref: str, expected: object) -> None:
    got = resolved(ref)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(("template", "expected"), [
    ("n=${steps.1.value.n}", "n=5"),
    ("${steps.1.value.s}!", "text!"),
    ("${steps.1.value.n}${steps.1.value.s}", "5text"),
    ("obj=${steps.1.value.obj}", 'obj={"a":1,"b":[true,null]}'),
    ("list=${steps.1.value.list}", 'list=[10,"twenty",{"x":"y"}]'),
    ("${steps.1.value.yes}/${steps.1.value.nothing}", "true/null"),
    ("f=${steps.1.value.f}", "f=2.5"),
    ("${steps.1.key}}", "src}"),
    ("${steps.x ${steps.1.key}", "${steps.x src"),
    ("${steps.1..a} ${steps.1.key}", "${steps.1..a} src"),
])
def test_an_embedded_reference_interpolates_as_text(template: str, expected: str) -> None:
    assert resolved(template) == expected


@pytest.mark.parametrize(("ref", "expected"), [
    ("${steps.1.value.obj.a}", 1),
    ("${steps.1.value.obj.b.0}", True),
    ("${steps.1.value.obj.b.1}", None),
    ("${steps.1.value.list.0}", 10),
    ("${steps.1.value.list.2.x}", "y"),
    ("${steps.1.value.dotted key}", "spaced"),
])
def test_dotted_paths_index_objects_and_arrays(ref: str, expected: object) -> None:
    assert resolved(ref) == expected


@pytest.mark.parametrize("text", ["${steps.٣.key}", "${steps.}", "${steps.1", "$ {steps.1}",
                                  "${steps.1.}", "${step.1}", "plain"])
def test_text_that_is_not_a_reference_is_kept(text: str) -> None:
    assert resolved(text) == text
    assert find_references({"value": text}) == []


def test_references_resolve_anywhere_in_the_arguments() -> None:
    args = {"table": "t", "id": "${steps.1.value.n}",
            "fields": {"label": "${steps.1.value.s}", "items": ["${steps.1.value.list.1}", 3]}}
    res = resolve(args, OUTPUTS, LIVE)
    assert res == Resolution(
        value={"table": "t", "id": 5, "fields": {"label": "text", "items": ["twenty", 3]}},
        referenced={1}, provenance={"id": 1, "fields.label": 1, "fields.items.0": 1})


def test_resolving_copies_only_what_it_changes() -> None:
    untouched = {"deep": [1, 2, {"x": "no reference here"}]}
    args = {"keep": untouched, "change": ["${steps.1.key}", "b"]}
    before = copy.deepcopy(args)
    value = resolve(args, OUTPUTS, LIVE).value
    assert value == {"keep": untouched, "change": ["src", "b"]}
    assert value["keep"] is untouched
    assert args == before


def test_a_document_without_references_is_returned_as_is() -> None:
    args = {"a": [1, {"b": "c"}]}
    res = resolve(args, {}, range(1, 1))
    assert res.value is args and res.referenced == set() and res.provenance == {}


def test_the_arguments_may_be_a_bare_string() -> None:
    assert resolve("${steps.1.key}", OUTPUTS, LIVE).value == "src"
    assert resolve("a ${steps.1.key} b", OUTPUTS, LIVE).value == "a src b"


# ---- what fails, with the exact raw message ------------------------------------------------

@pytest.mark.parametrize(("ref", "step", "message"), [
    ("${steps.9.key}", 9, 'step "9" does not exist (referenced as ${steps.9.key}); live steps: 1'),
    ("${steps.0.key}", 0, 'step "0" does not exist (referenced as ${steps.0.key}); live steps: 1'),
    ("${steps.2.value}", 2,
     'step "2" does not exist (referenced as ${steps.2.value}); live steps: 1'),
    ("before ${steps.7} after", 7,
     'step "7" does not exist (referenced as ${steps.7}); live steps: 1'),
    ("${steps.99999999999999999999.key}", None,
     'step "99999999999999999999" does not exist (referenced as '
     "${steps.99999999999999999999.key}); live steps: 1"),
])
def test_a_reference_to_a_step_that_is_not_live_fails(ref: str, step: int | None,
                                                      message: str) -> None:
    exc = failure({"key": "k", "value": ref})
    assert (exc.message, exc.argument, exc.step) == (message, "value", step)
    assert clean_error(exc.message).category == "undefined_object"


def test_live_steps_are_listed_then_shown_as_a_range() -> None:
    assert failure({"a": "${steps.3.value}"}, {}, range(1, 1)).message == \
        'step "3" does not exist (referenced as ${steps.3.value}); live steps: none'
    assert failure({"a": "${steps.30}"}, {}, range(1, 11)).message == \
        'step "30" does not exist (referenced as ${steps.30}); live steps: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10'
    assert failure({"a": "${steps.600}"}, {}, range(1, 500)).message == \
        'step "600" does not exist (referenced as ${steps.600}); live steps: 1-499'


def test_a_five_thousand_digit_step_gets_a_short_clean_message() -> None:
    ref = "${steps." + "9" * 5000 + ".x}"
    exc = failure({"a": ref})
    assert exc.message == (f'step "999999999999…(5000 digits)" does not exist (referenced as '
                           f"${{steps.{'9' * 52}…{'9' * 16}.x}}); live steps: 1")
    assert exc.step is None and exc.argument == "a"
    cleaned = clean_error(exc.message)
    assert cleaned.category == "undefined_object"
    assert "999999999999…(5000 digits)" in cleaned.hint


@pytest.mark.parametrize(("ref", "column"), [
    ("${steps.1.value.missing}", "value.missing"),
    ("${steps.1.value.list.3}", "value.list.3"),
    ("${steps.1.value.list.x}", "value.list.x"),
    ("${steps.1.value.list.²}", "value.list.²"),
    ("${steps.1.value.n.deeper}", "value.n.deeper"),
    ("${steps.1.nokey}", "nokey"),
    ("embedded ${steps.1.value.obj.zz} text", "value.obj.zz"),
    ("${steps.1.a${steps.1.key}", "a${steps"),  # the reference ends at the first `}`
])
def test_a_missing_path_is_an_undefined_column(ref: str, column: str) -> None:
    exc = failure({"value": ref})
    raw = ref[ref.index("${"):ref.index("}") + 1]
    assert exc.message == (f'column "{column}" does not exist in the output of step 1 '
                           f"(referenced as {raw})")
    assert (exc.argument, exc.step) == ("value", 1)
    assert clean_error(exc.message).category == "undefined_column"


@pytest.mark.parametrize("shape", ["embedded", "whole-in-list", "whole-in-object"])
def test_references_that_would_amplify_the_arguments_hit_a_limit(shape: str) -> None:
    ref = "${steps.1.value}"
    value = {"embedded": ref * 5000, "whole-in-list": [ref] * 5000,
             "whole-in-object": {f"f{i}": ref for i in range(5000)}}[shape]
    exc = failure({"key": "k", "value": value}, {1: {"value": "x" * 200_000}})
    assert exc.message == ("program limit exceeded: references expand the arguments to more "
                           f"than {MAX_EXPANSION} characters (referenced as ${{steps.1.value}})")
    assert clean_error(exc.message).category == "program_limit_exceeded"
    # ten of them are fine
    assert resolved([ref] * 10, {1: {"value": "x" * 200_000}}) == ["x" * 200_000] * 10


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_reference_may_not_nest_the_arguments_beyond_the_json_limit() -> None:
    # {"a": {"b": <here>}}: the value sits in 2 containers, so it may nest 126 more levels
    assert resolve({"a": {"b": "${steps.1}"}}, {1: nested(126)}, LIVE).value == \
        {"a": {"b": nested(126)}}
    exc = failure({"a": {"b": "${steps.1}"}}, {1: nested(127)})
    assert exc.message == ("program limit exceeded: references nest the arguments deeper than "
                           f"{MAX_DEPTH} levels (referenced as ${{steps.1}} in a.b)")
    assert (exc.argument, exc.step) == ("a.b", 1)
    assert clean_error(exc.message).category == "program_limit_exceeded"
    # a key with a dot is one level, not two
    assert resolve({"a.b": "${steps.1}"}, {1: nested(127)}, LIVE).value == {"a.b": nested(127)}
    # embedded, the same value is text and nests nothing
    assert resolve({"a": {"b": "=${steps.1}"}}, {1: nested(127)}, LIVE).value == \
        {"a": {"b": "=" + json.dumps(nested(127), separators=(",", ":"))}}


def test_the_nesting_limit_holds_for_a_parsed_document_at_the_limit() -> None:
    text = '{"v": ' + "[" * 127 + '"${steps.1}"' + "]" * 127 + "}"
    args = parse_arguments(text)  # 128 levels: the most the JSON may nest
    assert json.dumps(resolve(args, {1: 5}, LIVE).value).count("[") == 127
    exc = failure(args, {1: [5]})
    assert exc.message.startswith("program limit exceeded: references nest the arguments deeper")
    assert exc.argument == "v" + ".0" * 127


def test_an_output_missing_for_a_live_step_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="the output of live step 1 was not given"):
        resolve({"a": "${steps.1}"}, {}, LIVE)


# ---- dependencies and culprits (issue 9 item 2) ---------------------------------------------

def test_a_failing_reference_still_reports_every_live_step_referenced() -> None:
    # step 3's reference resolved, step 1's path fails: 3 stays a dependency (the nearest)
    args = parse_arguments('{"a":"${steps.3.value}","b":"${steps.1.value.missing}"}')
    exc = failure(args, {1: {"value": 1}, 3: {"value": 3}}, range(1, 4))
    assert (exc.argument, exc.step) == ("b", 1)
    assert exc.referenced == {1, 3}


def test_references_after_the_failing_one_count_too() -> None:
    args = {"a": "${steps.9.x}", "b": ["${steps.2.value}", "${steps.4.value}"], "c": "${steps.x}"}
    exc = failure(args, {2: {"value": 2}, 4: {"value": 4}}, range(1, 5))
    assert (exc.argument, exc.step) == ("a", 9)
    assert exc.referenced == {2, 4}


def test_provenance_names_the_step_behind_each_argument() -> None:
    args = {"fields": "${steps.2.value}", "id": "${steps.1.key}",
            "tags": ["x", "${steps.1.key}-${steps.2.value.c}"]}
    res = resolve(args, {1: {"key": "k"}, 2: {"value": {"c": 7}}}, range(1, 3))
    assert res.value == {"fields": {"c": 7}, "id": "k", "tags": ["x", "k-7"]}
    assert res.referenced == {1, 2}
    assert res.provenance == {"fields": 2, "id": 1, "tags.1": 2}


@pytest.mark.parametrize(("argument", "provenance", "step"), [
    ("fields.c", {"fields": 2}, 2),  # below a whole-object reference
    ("fields.c.d", {"fields": 2}, 2),
    ("fields", {"fields.c": 2}, 2),  # above a reference
    ("fields.c", {"fields.c": 3, "fields": 2}, 3),  # the path itself first
    ("id", {"fields": 2}, None),
    ("fieldsx", {"fields": 2}, None),
    ("fields", {"fieldsx.c": 2}, None),
    ("", {"fields": 2}, None),
    (None, {"fields": 2}, None),
])
def test_offending_step_follows_references_up_and_down(argument: str | None,
                                                       provenance: dict[str, int],
                                                       step: int | None) -> None:
    assert offending_step(argument, provenance) == step


def test_a_culprit_is_found_through_a_whole_object_reference() -> None:
    # "fields": "${steps.2.value}" whose field c then fails a foreign key: culprit step 2
    res = resolve({"table": "t", "fields": "${steps.2.value}"}, {2: {"value": {"c": 9}}},
                  range(1, 3))
    assert offending_step("fields.c", res.provenance) == 2


# ---- finding ---------------------------------------------------------------------------------

def test_find_references_lists_every_reference_in_document_order() -> None:
    args = {"fields": {"c": "${steps.2.value}"}, "items": ["a ${steps.1} b ${steps.2.x.0}"],
            "n": 5, "k${steps.1}": "key text is not scanned",
            "big": "${steps." + "7" * 30 + ".v}"}
    refs = find_references(args)
    assert [(r.argument, r.step, r.digits, r.path, r.raw, r.offset, r.whole) for r in refs] == [
        ("fields.c", 2, "2", ("value",), "${steps.2.value}", 0, True),
        ("items.0", 1, "1", (), "${steps.1}", 2, False),
        ("items.0", 2, "2", ("x", "0"), "${steps.2.x.0}", 15, False),
        ("big", None, "7" * 30, ("v",), "${steps." + "7" * 30 + ".v}", 0, True),
    ]
    assert all(isinstance(r, Reference) for r in refs)


def test_has_reference_sees_anything_that_looks_like_one() -> None:
    assert has_reference({"a": [{"b": "x ${steps.oops"}]})
    assert has_reference("${steps.")
    assert not has_reference({"${steps.1}": 1, "a": [1, None, "text"]})
    assert not has_reference(5)


# ---- hostile inputs (hang guards: the old regex restarted at every `${`) -------------------

@pytest.mark.timeout(20, method="thread")
def test_a_mebibyte_of_unterminated_references_is_text() -> None:
    text = "${steps.1.a" * 95_000
    assert find_references({"v": text}) == []
    assert resolve({"v": text}, OUTPUTS, LIVE).value == {"v": text}
    # one `}` at the very end makes the first candidate a (missing) path of step 1
    exc = failure({"v": text + "}"})
    assert exc.message.startswith('column "a${steps" does not exist in the output of step 1')


@pytest.mark.timeout(20, method="thread")
def test_a_mebibyte_of_failed_candidates_is_scanned_once() -> None:
    text = "${steps.1..${steps.x}" * 50_000 + "${steps.1.key}"
    refs = find_references({"v": text})
    assert [(r.step, r.raw) for r in refs] == [(1, "${steps.1.key}")]
    assert resolve({"v": text}, OUTPUTS, LIVE).value["v"].endswith("}src")


@pytest.mark.timeout(20, method="thread")
def test_fifty_thousand_references_resolve() -> None:
    args = {"v": ["${steps.1.value.n}"] * 50_000, "w": "-".join(["${steps.1.key}"] * 20_000)}
    res = resolve(args, OUTPUTS, LIVE)
    assert res.value["v"] == [5] * 50_000
    assert res.value["w"] == "-".join(["src"] * 20_000)
    assert res.referenced == {1}


# ---- a budget: what the engine may resolve on its event loop (engine/arguments.py) --------

BUDGET_CASES = [
    {"v": "${steps.1.value.n}"},
    {"v": ["${steps.1.value}"] * 300},
    {"v": "-".join(["${steps.1.key}"] * 100)},
    {"a": "${steps.1.value.obj}", "b": "${steps.9.x}", "c": "${steps.1.value.list}"},
    {"a": "${steps.1.value.missing}", "b": ["${steps.1.value}"] * 500},
    {"v": ["${steps.1.value}"] * 3 + ["${steps.2}"]},
]
BIG_OUTPUTS = {**OUTPUTS, 2: {"rows": [{"id": i, "name": f"row {i}"} for i in range(5000)]}}


def outcome(args: object, budget: int | None) -> object:
    try:
        res = resolve(args, BIG_OUTPUTS, range(1, 3), budget=budget)
    except ReferenceError_ as exc:
        return ("error", exc.message, exc.argument, exc.step, exc.referenced)
    return ("ok", res.value, res.referenced, res.provenance)


@pytest.mark.parametrize("args", BUDGET_CASES)
@pytest.mark.parametrize("budget", [0, 300, 5_000, 64 * 1024, 10**9])
def test_a_budget_never_changes_the_outcome_it_only_gives_up(args: object, budget: int) -> None:
    try:
        bounded = outcome(args, budget)
    except OverBudget:
        return
    assert bounded == outcome(args, None)


def test_a_small_resolution_fits_the_engines_inline_budget() -> None:
    args = {"a": "${steps.1.value.obj}", "b": "n=${steps.1.value.n}"}
    assert resolve(args, OUTPUTS, LIVE, budget=64 * 1024).value == \
        {"a": {"a": 1, "b": [True, None]}, "b": "n=5"}


def test_many_references_are_over_budget_before_any_is_looked_up() -> None:
    # step 9 is not live: looking up the first reference would raise ReferenceError_
    with pytest.raises(OverBudget):
        resolve({"v": ["${steps.9.x}"] * 1000}, OUTPUTS, LIVE, budget=64 * 1024)


def test_a_large_referenced_value_is_over_budget_before_it_is_serialised() -> None:
    # object() cannot be serialised: reaching it (walking it all, or dumps) would raise
    # TypeError. The walk gives up after about the budget's worth of items instead.
    huge = [[0] * 1000 for _ in range(1000)] + [object()]
    with pytest.raises(OverBudget):
        resolve({"v": "${steps.1.rows}"}, {1: {"rows": huge}}, LIVE, budget=64 * 1024)
    with pytest.raises(OverBudget):
        resolve({"v": "${steps.1.rows}"}, {1: {"rows": [0] * 10**6 + [object()]}}, LIVE,
                budget=64 * 1024)
    with pytest.raises(OverBudget):
        resolve({"v": "${steps.1.text}"}, {1: {"text": "x" * 100_000}}, LIVE, budget=64 * 1024)


def test_a_long_reference_path_counts_against_the_budget() -> None:
    ref = "${steps.1" + ".a" * 40_000 + "}"
    with pytest.raises(OverBudget):
        resolve({"v": ref}, OUTPUTS, LIVE, budget=64 * 1024)
