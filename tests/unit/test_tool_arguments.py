"""The Tool interface's argument models: serde-style messages for custom tools too
(docs/tools.md#arguments).

A custom tool may describe its arguments with a pydantic model; its validation errors must
read like the built-ins' (serde) so the cleaner gives the same hints, naming the argument.
Pure: no etcd, no server.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel
from pydantic import Field as PydanticField

from agenttx.cleaner import clean_error
from agenttx.tools.base import (
    ArgType,
    Field,
    RollbackKind,
    Tool,
    ToolArguments,
    ToolError,
    ToolResult,
    validate_arguments,
)
from agenttx.tools.registry import ToolRegistry


class Address(ToolArguments):
    city: str


class Args(ToolArguments):
    id: str = PydanticField(pattern=r"^[a-z0-9-]{1,16}$")
    count: int = PydanticField(1, ge=1)
    ratio: float = 1.0
    mode: Literal["fast", "safe"] = "safe"
    tags: list[str] = []
    address: Address | None = None


@pytest.mark.parametrize(("args", "message", "argument", "hint_fragments"), [
    ({}, "missing field `id`", "id", ['"id" is missing']),
    ({"id": "a", "x": 1}, "unknown field `x`, expected one of `id`, `count`, `ratio`, `mode`, "
     "`tags`, `address`", "x", ['"x" is not accepted', '"count"']),
    ({"id": 5}, "id: invalid type: integer `5`, expected a string", "id",
     ['"id" has the wrong type', "string"]),
    ({"id": "a", "count": "5"}, 'count: invalid type: string "5", expected an integer', "count",
     ['"count"', "integer"]),
    ({"id": "a", "count": 2.0}, "count: invalid type: floating point `2.0`, expected an integer",
     "count", ['"count"']),
    ({"id": "a", "count": True}, "count: invalid type: boolean `true`, expected an integer",
     "count", ['"count"']),
    ({"id": "a", "count": 0}, "count: invalid value: integer `0`, expected a value greater than "
     "or equal to 1", "count", ['"count" has an invalid value']),
    ({"id": "A!"}, 'id: invalid value: string "A!", expected a string matching ^[a-z0-9-]{1,16}$',
     "id", ['"id"', "A!"]),
    ({"id": "a", "mode": "turbo"}, "mode: unknown variant `turbo`, expected one of `fast`, `safe`",
     "mode", ['"turbo"', '"mode"', '"fast"']),
    ({"id": "a", "tags": ["x", 3]}, "tags[1]: invalid type: integer `3`, expected a string",
     "tags.1", ['"tags[1]"']),
    ({"id": "a", "address": {}}, "address: missing field `city`", "address.city",
     ['"address.city" is missing']),
    ({"id": "a", "address": {"city": "x", "zip": 1}}, "address: unknown field `zip`",
     "address.zip", ['"address.zip"']),
    # unknown fields are reported before missing ones, as serde meets them
    ({"x": 1}, "unknown field `x`, expected one of `id`, `count`, `ratio`, `mode`, `tags`, "
     "`address`", "x", ['"x"']),
])
def test_pydantic_errors_become_serde_messages_naming_the_argument(
        args: dict[str, Any], message: str, argument: str, hint_fragments: list[str]) -> None:
    with pytest.raises(ToolError) as err:
        validate_arguments(args, Args)
    assert (err.value.message, err.value.argument) == (message, argument)
    cleaned = clean_error(err.value.message)
    assert cleaned.category == "invalid_parameter_value"
    for fragment in hint_fragments:
        assert fragment in cleaned.hint, (fragment, cleaned.hint)


def test_a_valid_model_is_returned_as_an_instance_in_strict_mode() -> None:
    parsed = validate_arguments({"id": "a-1", "ratio": 2, "address": {"city": "Oslo"}}, Args)
    assert isinstance(parsed, Args)
    assert (parsed.id, parsed.count, parsed.ratio, parsed.address) == ("a-1", 1, 2.0,
                                                                       Address(city="Oslo"))


def test_field_sequences_name_the_argument_of_a_type_error() -> None:
    fields = (Field("key", ArgType.STRING), Field("value", ArgType.ANY, required=False))
    assert validate_arguments({"key": "k"}, fields) == {"key": "k", "value": None}
    with pytest.raises(ToolError) as err:
        validate_arguments({"key": 5}, fields)
    assert err.value.message == "key: invalid type: integer `5`, expected a string"
    assert clean_error(err.value.message).hint.startswith('Argument "key" has the wrong type')


class _Saga(Tool):
    name = "x.saga"
    fields = Args
    rollback = RollbackKind.SAGA

    async def execute(self, args: Any, ctx: Any) -> ToolResult:
        return ToolResult({}, compensation={})

    async def compensate(self, compensation: Any) -> None:
        pass


class _SagaWithoutUndo(_Saga):
    name = "x.saga-no-undo"
    compensate = Tool.compensate


class _BadFields(Tool):
    name = "x.bad-fields"
    fields = "id"  # type: ignore[assignment]


class _BadKind(Tool):
    name = "x.bad-kind"
    rollback = "saga"  # type: ignore[assignment]


class _PlainModel(BaseModel):
    a: int


class _PlainModelTool(Tool):
    name = "x.plain"
    fields = _PlainModel


def test_the_registry_checks_a_plugin_shape_when_adding_it() -> None:
    registry = ToolRegistry([])
    registry.add(_Saga())
    registry.add(_PlainModelTool())
    for bad, why in ((_SagaWithoutUndo(), "compensate"), (_BadFields(), "fields"),
                     (_BadKind(), "RollbackKind"), (_Saga(), "twice")):
        with pytest.raises(ValueError, match=why):
            registry.add(bad)
    assert registry.names() == ["x.plain", "x.saga"]
    assert len(ToolRegistry.load(plugins=False).names()) == 8  # the built-ins pass the checks
