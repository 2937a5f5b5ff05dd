"""A toolset tool's arguments against its upstream's inputSchema: serde's words, the
argument's path, and the hint the cleaner makes of them (the built-ins' hints)."""

from __future__ import annotations

import pytest

from agenttx.cleaner import clean_error
from agenttx.tools.base import ToolError
from agenttx.tools.toolsets.schema import ArgumentSchema, InvalidSchema, is_small

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 3},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "fields": {"type": "object", "additionalProperties": False,
                   "properties": {"kind": {"enum": ["bug", "feature"]},
                                  "estimate": {"type": ["number", "null"]}}},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title"],
    "additionalProperties": False,
}


def failure(arguments: dict) -> tuple[str, str | None, str, str]:
    with pytest.raises(ToolError) as err:
        ArgumentSchema(SCHEMA).check(arguments)
    cleaned = clean_error(err.value.message)
    return err.value.message, err.value.argument, cleaned.category, cleaned.hint


@pytest.mark.parametrize(("arguments", "message", "argument", "hint"), [
    ({"title": "abc", "priority": "high"},
     'priority: invalid type: string "high", expected an integer', "priority",
     'Argument "priority" has the wrong type (string "high"); send an integer instead.'),
    ({"priority": 2}, "missing field `title`", "title",
     'Argument "title" is missing; add it to arguments_json.'),
    ({"title": "abc", "owner": "me"},
     "unknown field `owner`, expected one of `title`, `priority`, `fields`, `tags`", "owner",
     'Argument "owner" is not accepted; use only "title", "priority", "fields", "tags".'),
    ({"title": "abc", "fields": {"kind": "urgent"}},
     "fields.kind: unknown variant `urgent`, expected one of `bug`, `feature`", "fields.kind",
     'Value "urgent" is not accepted for "fields.kind"; use one of "bug", "feature".'),
    ({"title": "abc", "fields": {"size": 1}},
     "fields: unknown field `size`, expected one of `kind`, `estimate`", "fields.size",
     'Argument "fields.size" is not accepted; use only "kind", "estimate".'),
    ({"title": "abc", "tags": ["a", 7]},
     "tags[1]: invalid type: integer `7`, expected a string", "tags.1",
     'Argument "tags[1]" has the wrong type (integer 7); send a string instead.'),
    ({"title": "abc", "fields": {"estimate": "big"}},
     'fields.estimate: invalid type: string "big", expected a number or null',
     "fields.estimate", None),
    ({"title": "abc", "priority": 9},
     "priority: invalid value: integer `9`, expected a number <= 5", "priority",
     'Argument "priority" has an invalid value (integer 9); send a number <= 5 instead.'),
    ({"title": "ab"}, 'title: invalid value: string "ab", expected a string of at least 3 '
     "characters", "title", None),
])
def test_a_violation_reads_like_a_builtins_and_names_the_argument(
        arguments, message, argument, hint) -> None:
    got_message, got_argument, category, got_hint = failure(arguments)
    assert (got_message, got_argument, category) == (message, argument,
                                                     "invalid_parameter_value")
    if hint is not None:
        assert got_hint == hint


def test_unknown_fields_and_bad_values_are_reported_before_missing_ones() -> None:
    message, *_ = failure({"priority": "high"})
    assert message.startswith("priority: invalid type")


def test_valid_arguments_pass_and_an_open_schema_accepts_more() -> None:
    ArgumentSchema(SCHEMA).check({"title": "abc", "priority": 2, "tags": ["x"]})
    ArgumentSchema({"type": "object", "properties": {"a": {"type": "string"}}}).check(
        {"a": "x", "anything": [1]})
    ArgumentSchema({}).check({"x": 1})


def test_a_schema_that_is_not_json_schema_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidSchema, match="not a valid JSON Schema"):
        ArgumentSchema({"type": "no-such-type"})


def test_remote_references_are_never_fetched_and_blamed_on_the_upstream() -> None:
    schema = ArgumentSchema({"$ref": "http://127.0.0.1:9/evil.json"})
    with pytest.raises(ToolError) as err:
        schema.check({"x": 1})
    assert (err.value.category, err.value.message) == (
        "fdw_error", "the upstream's input schema refers to 'http://127.0.0.1:9/evil.json', "
        "which it does not contain (remote references are not fetched)")


def test_large_documents_are_counted_cheaply() -> None:
    assert is_small({"a": [1, 2, 3]})
    assert not is_small({"a": list(range(5000))})
    assert not is_small([[[i] for i in range(3000)]])
