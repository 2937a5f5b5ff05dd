"""tools/schema.py: a tool's input schema says exactly what its argument model accepts.

For the built-ins (`Field` sequences) and pydantic models alike, a JSON Schema validator
and `validate_arguments` must agree on every sample; references (`${steps.N…}`) are the
one documented widening. Pure: no etcd, no server.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import pytest
from jsonschema import Draft202012Validator
from pydantic import Field as PydanticField

from agenttx.args.refs import find_references
from agenttx.tools.base import ToolArguments, ToolError, validate_arguments
from agenttx.tools.registry import ToolRegistry
from agenttx.tools.schema import REFERENCE_PATTERN, REFERENCE_SCHEMA, input_schema

BUILTINS = ToolRegistry.load(plugins=False)


class Address(ToolArguments):
    city: str


class Ticket(ToolArguments):
    """A ticket."""

    id: str = PydanticField(pattern=r"^[a-z0-9-]{1,16}$", description="unique id")
    count: int = PydanticField(1, ge=1)
    mode: Literal["fast", "safe"] = "safe"
    tags: list[str] = []
    address: Address | None = None
    note: str = ""


def _accepted(fields: Any, args: dict[str, Any]) -> bool:
    try:
        validate_arguments(args, fields)
    except ToolError:
        return False
    return True


def test_builtin_schemas_are_exact():
    assert input_schema(BUILTINS.get("kv.put").fields) == {
        "type": "object",
        "properties": {"key": {"type": "string"},
                       "value": {"type": ["string", "number", "integer", "boolean", "object",
                                          "array", "null"],
                                 "description": "any JSON value"}},
        "required": ["key"],
        "additionalProperties": False,
    }
    assert input_schema(BUILTINS.get("record.insert").fields) == {
        "type": "object",
        "properties": {
            "table": {"type": "string"},
            "id": {"type": ["string", "number"]},
            "fields": {"anyOf": [{"type": "object"}, REFERENCE_SCHEMA]},
            "references": {"anyOf": [{"type": "object"}, REFERENCE_SCHEMA]},
        },
        "required": ["table", "id"],
        "additionalProperties": False,
    }
    assert input_schema(BUILTINS.get("record.insert").fields, references=False)["properties"][
        "fields"] == {"type": "object"}


@pytest.mark.parametrize("name", BUILTINS.names())
def test_every_builtin_schema_is_a_valid_object_schema(name):
    schema = input_schema(BUILTINS.get(name).fields)
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and schema["additionalProperties"] is False


@pytest.mark.parametrize(("tool", "args"), [
    ("record.insert", {"table": "t", "id": 1}),
    ("record.insert", {"table": "t", "id": "x", "fields": {"a": 1}, "references": {}}),
    ("record.insert", {"table": "t", "id": 2.5}),
    ("record.insert", {"table": "t"}),
    ("record.insert", {"table": 5, "id": 1}),
    ("record.insert", {"table": "t", "id": True}),
    ("record.insert", {"table": "t", "id": [1]}),
    ("record.insert", {"table": "t", "id": 1, "extra": 1}),
    ("record.insert", {"table": "t", "id": 1, "fields": [1]}),
    ("kv.put", {"key": "k"}),
    ("kv.put", {"key": "k", "value": [None, {"a": 1}]}),
    ("kv.put", {"value": 1}),
    ("kv.put", {"key": None}),
    ("effect.stage", {"channel": "log", "idempotency_key": 7}),
    ("fs.write", {"path": "a", "contents": "b"}),
    ("fs.write", {"path": "a"}),
])
def test_builtin_schema_and_validation_agree(tool, args):
    fields = BUILTINS.get(tool).fields
    valid = Draft202012Validator(input_schema(fields)).is_valid(args)
    assert valid == _accepted(fields, args), (args, valid)


@pytest.mark.parametrize("args", [
    {"id": "a-1"},
    {"id": "a-1", "count": 3, "mode": "fast", "tags": ["x"], "address": {"city": "Oslo"}},
    {"id": "A"},
    {"id": "a", "count": 0},
    {"id": "a", "count": "3"},
    {"id": "a", "mode": "slow"},
    {"id": "a", "tags": [1]},
    {"id": "a", "address": {"city": 1}},
    {"id": "a", "address": {"city": "x", "zip": "1"}},
    {"id": "a", "owner": "me"},
    {"count": 1},
])
def test_pydantic_schema_and_validation_agree(args):
    valid = Draft202012Validator(input_schema(Ticket, references=False)).is_valid(args)
    assert valid == _accepted(Ticket, args), (args, valid)


def test_pydantic_schema_keeps_descriptions_and_drops_the_class_title():
    schema = input_schema(Ticket)
    Draft202012Validator.check_schema(schema)
    assert "title" not in schema and schema["description"] == "A ticket."
    assert schema["required"] == ["id"] and schema["additionalProperties"] is False
    assert schema["properties"]["id"] == {
        "anyOf": [{"pattern": "^[a-z0-9-]{1,16}$", "type": "string"}, REFERENCE_SCHEMA],
        "title": "Id", "description": "unique id"}
    assert schema["properties"]["note"] == {"default": "", "title": "Note", "type": "string"}


@pytest.mark.parametrize("args", [
    {"id": "${steps.1.id}", "count": "${steps.2.output.n}", "mode": "${steps.1.mode}"},
    {"id": "a", "tags": ["${steps.3.tags.0}"], "address": {"city": "${steps.1.city}"}},
    {"id": "a", "address": "${steps.4}"},
])
def test_references_are_accepted_wherever_a_value_goes(args):
    assert Draft202012Validator(input_schema(Ticket)).is_valid(args)


@pytest.mark.parametrize("text", [
    "${steps.1}", "${steps.12.id}", "${steps.1.a.b.0}", "${steps.x}", "${steps.1.}",
    "${steps.1.a}b", "a${steps.1}", "${steps.}", "${step.1}", "${steps.1.a.b}}",
])
def test_the_reference_pattern_matches_what_the_engine_resolves(text):
    found = find_references({"a": text})
    whole = len(found) == 1 and found[0].whole
    assert bool(re.fullmatch(REFERENCE_PATTERN.strip("^$"), text)) == whole
