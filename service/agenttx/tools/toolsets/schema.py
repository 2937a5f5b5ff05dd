"""A toolset tool's arguments checked against its upstream's `inputSchema` (JSON Schema),
with errors worded like the built-ins' (serde), before any call (docs/toolsets.md).

Why serde's words: the error cleaner turns ``fields.priority: invalid type: string
"high", expected an integer`` into the same hint a built-in's bad argument gets
(`Argument "fields.priority" has the wrong type ...`), and the argument path lets the
planner blame the step whose output was passed in through `${steps.N…}`. A model that
learned to fix a built-in's arguments fixes a toolset's the same way.

Which error is reported when several apply: like serde (and the pydantic models of
custom tools, tools/base.py), unknown fields and bad values first, missing fields last;
among equals, `jsonschema`'s `best_match` (the most specific failure, descending into
`anyOf`/`oneOf`).

Schemas are compiled once per (toolset, tool, schema) by `ArgumentSchema`; remote `$ref`s
are never fetched (an empty `referencing` registry: a schema resolves within itself).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jsonschema import SchemaError, ValidationError
from jsonschema.exceptions import best_match
from jsonschema.validators import Draft202012Validator, validator_for
from referencing import Registry
from referencing.exceptions import Unresolvable

from ...args.jsonargs import describe
from ..base import ToolError

_TYPES = {
    "string": "a string", "integer": "an integer", "number": "a number",
    "boolean": "a boolean", "object": "a map", "array": "a sequence", "null": "null",
}
# Reported first, like serde: unknown fields, then bad values, missing fields last.
_RANK = {"additionalProperties": 0, "unevaluatedProperties": 0, "required": 2}


class InvalidSchema(ValueError):
    """The upstream's inputSchema is not a JSON Schema; the message says why."""


def serde_path(path: Iterable[Any]) -> str:
    """`fields.tags[1]`: serde_path_to_error's spelling of a JSON location."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _dotted(path: Iterable[Any]) -> str:
    """`fields.tags.1`: the engine's spelling (references, provenance)."""
    return ".".join(str(p) for p in path)


def _expected_type(value: Any) -> str:
    names = [value] if isinstance(value, str) else list(value or ())
    return " or ".join(_TYPES.get(str(n), f"a {n}") for n in names) or "a valid value"


def _expected_value(err: ValidationError) -> str:
    keyword, bound = err.validator, err.validator_value
    simple = {
        "minimum": f"a number >= {bound}", "maximum": f"a number <= {bound}",
        "exclusiveMinimum": f"a number > {bound}", "exclusiveMaximum": f"a number < {bound}",
        "multipleOf": f"a multiple of {bound}",
        "minLength": f"a string of at least {bound} characters",
        "maxLength": f"a string of at most {bound} characters",
        "pattern": f"a string matching {bound}",
        "minItems": f"a sequence with at least {bound} items",
        "maxItems": f"a sequence with at most {bound} items",
        "uniqueItems": "a sequence without duplicates",
        "minProperties": f"a map with at least {bound} entries",
        "maxProperties": f"a map with at most {bound} entries",
        "format": f"a valid {bound}",
    }
    if keyword in simple:
        return simple[str(keyword)]
    if keyword == "const":
        return f"the value {describe(bound)}"
    if keyword == "enum":
        return "one of " + ", ".join(describe(v) for v in (bound or ()))
    message = err.message if len(err.message) <= 120 else err.message[:119] + "…"
    return f"a value the tool accepts ({message})"


def serde_message(err: ValidationError, arguments: Mapping[str, Any]) -> tuple[str, str]:
    """One jsonschema error -> (serde-style message, dotted argument path)."""
    path = list(err.absolute_path)
    at = f"{serde_path(path)}: " if path else ""
    keyword, value = err.validator, err.instance
    if keyword == "required" and isinstance(value, Mapping):
        missing = next((str(f) for f in err.validator_value or () if f not in value), "?")
        return f"{at}missing field `{missing}`", _dotted([*path, missing])
    if keyword in ("additionalProperties", "unevaluatedProperties") \
            and isinstance(value, Mapping):
        schema = err.schema if isinstance(err.schema, Mapping) else {}
        known = list((schema.get("properties") or {}).keys())
        extra = next((str(k) for k in value if k not in known), "?")
        tail = (", expected one of " + ", ".join(f"`{k}`" for k in known)) if known \
            else ", there are no fields"
        return f"{at}unknown field `{extra}`{tail}", _dotted([*path, extra])
    if keyword == "type":
        return (f"{at}invalid type: {describe(value)}, expected "
                f"{_expected_type(err.validator_value)}"), _dotted(path)
    if keyword == "enum" and isinstance(value, str) and all(
            isinstance(v, str) for v in err.validator_value or ()):
        choices = ", ".join(f"`{v}`" for v in err.validator_value)
        return f"{at}unknown variant `{value}`, expected one of {choices}", _dotted(path)
    return f"{at}invalid value: {describe(value)}, expected {_expected_value(err)}", \
        _dotted(path)


class ArgumentSchema:
    """A compiled upstream inputSchema. `check(arguments)` raises ToolError (serde's
    wording, `argument` set) on the first violation, as the built-ins do."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        doc = dict(schema) if isinstance(schema, Mapping) else {}
        cls = validator_for(doc, default=Draft202012Validator)
        try:
            cls.check_schema(doc)
        except SchemaError as exc:
            raise InvalidSchema(f"not a valid JSON Schema: {exc.message}") from None
        self.schema = doc
        self._validator = cls(doc, registry=Registry())

    def errors(self, arguments: Mapping[str, Any]) -> Sequence[ValidationError]:
        try:
            return list(self._validator.iter_errors(dict(arguments)))
        except Unresolvable as exc:
            raise ToolError(f"the upstream's input schema refers to {exc.ref!r}, which it "
                            "does not contain (remote references are not fetched)",
                            category="fdw_error") from None

    def check(self, arguments: Mapping[str, Any]) -> None:
        errors = self.errors(arguments)
        if not errors:
            return
        rank = min(_RANK.get(str(e.validator), 1) for e in errors)
        chosen = best_match(e for e in errors if _RANK.get(str(e.validator), 1) == rank)
        assert chosen is not None
        message, argument = serde_message(chosen, arguments)
        raise ToolError(message, argument=argument or None)


def is_small(doc: Any, budget: int = 2000) -> bool:
    """Whether `doc` has fewer than `budget` JSON nodes (cheap: stops counting at the
    budget). Larger documents are validated off the event loop."""
    stack, seen = [doc], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen >= budget:
            return False
        if isinstance(node, Mapping):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


__all__ = ["ArgumentSchema", "InvalidSchema", "is_small", "serde_message", "serde_path"]
