"""The JSON Schema (2020-12) of a tool's arguments, derived from its argument model.

Why: MCP clients, and the models behind them, pick a tool's arguments from its input
schema. It has to say what `validate_arguments` accepts: the same fields, types,
required set and no unknown fields, for a `Field` sequence (the built-ins) and for a
pydantic model (custom tools) alike, so a model is never told one thing and refused
another.

One deliberate widening: a step may pass `${steps.N.path}` instead of a value; the
engine replaces it before validating. So wherever a plain string would not already be
accepted (an object, a number, an enum, a pattern-constrained string), the schema also
accepts a whole-string reference (`REFERENCE_SCHEMA`). References embedded in a longer
string (`"order ${steps.1.id}"`) are only described for unconstrained strings.

Pure: no I/O. Never a second source of truth: everything here is read off the model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .base import ArgType, ArgumentModel, Field

# A whole-string reference, as agenttx.args.refs reads one (tests/unit/test_tool_schema.py
# checks the two agree).
REFERENCE_PATTERN = r"^\$\{steps\.[0-9]+(\.[^.}]+)*\}$"
REFERENCE_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": REFERENCE_PATTERN,
    "description": "or a live step's output: ${steps.N.path}",
}

_FIELD_TYPES: dict[ArgType, dict[str, Any]] = {
    ArgType.STRING: {"type": "string"},
    ArgType.ID: {"type": ["string", "number"]},
    ArgType.OBJECT: {"type": "object"},
    # every JSON type spelled out, so a generic MCP client sends typed values (42, not "42")
    ArgType.ANY: {"type": ["string", "number", "integer", "boolean", "object", "array", "null"],
                  "description": "any JSON value"},
}
_ANNOTATIONS = ("title", "description", "default", "examples")
_STRING_CONSTRAINTS = ("pattern", "enum", "const", "format", "minLength", "maxLength")


def input_schema(fields: ArgumentModel, *, references: bool = True) -> dict[str, Any]:
    """The schema of the arguments object a tool with argument model `fields` accepts.
    With `references` (the default) values may also be whole `${steps…}` references."""
    if fields is None:  # the tool checks its own arguments: any object
        schema: dict[str, Any] = {"type": "object"}
    elif isinstance(fields, type) and issubclass(fields, BaseModel):
        schema = _model_schema(fields)
    else:
        schema = _fields_schema(fields)
    return _walk(schema) if references else schema


def _fields_schema(fields: Sequence[Field]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for f in fields:
        prop = dict(_FIELD_TYPES[f.type])
        if not f.required and f.default is not None:
            prop["default"] = f.default
        properties[f.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = [f.name for f in fields if f.required]
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = copy.deepcopy(model.model_json_schema(mode="validation"))
    schema.pop("title", None)  # the model's class name; the tool has its own name
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    if model.model_config.get("extra") == "forbid":
        schema["additionalProperties"] = False
    return schema


def _accepts_any_string(schema: dict[str, Any]) -> bool:
    keys = set(schema) - set(_ANNOTATIONS)
    if not keys:
        return True  # {}: any JSON value
    for union in ("anyOf", "oneOf"):
        if keys == {union}:
            return any(isinstance(b, dict) and _accepts_any_string(b) for b in schema[union])
    kind = schema.get("type")
    is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
    return is_string and keys <= {"type"} and not any(k in schema for k in _STRING_CONSTRAINTS)


def _walk(node: dict[str, Any]) -> dict[str, Any]:
    """Widen every value position below `node` (not `node` itself) to accept references."""
    props = node.get("properties")
    if isinstance(props, dict):
        node["properties"] = {k: _widen(v) for k, v in props.items()}
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _widen(node[key])
    for union in ("anyOf", "oneOf", "allOf"):
        if isinstance(node.get(union), list):
            node[union] = [_walk(b) if isinstance(b, dict) else b for b in node[union]]
    defs = node.get("$defs")
    if isinstance(defs, dict):
        node["$defs"] = {k: _walk(v) if isinstance(v, dict) else v for k, v in defs.items()}
    return node


def _widen(schema: dict[str, Any]) -> dict[str, Any]:
    schema = _walk(dict(schema))
    if _accepts_any_string(schema):
        return schema
    lifted = {k: schema.pop(k) for k in _ANNOTATIONS if k in schema}
    return {"anyOf": [schema, dict(REFERENCE_SCHEMA)], **lifted}


__all__ = ["REFERENCE_PATTERN", "REFERENCE_SCHEMA", "input_schema"]
