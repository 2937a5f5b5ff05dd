"""The Tool interface: what a built-in or third-party tool implements.

A tool is a class with a `name`, an argument model (`fields`), an async `execute`, and
a `rollback` kind that tells the engine how to undo it:

- ``RollbackKind.JOURNAL``   writes go through `ctx.kv_put` / `ctx.record_insert` …; they
  are buffered per step and dropped when the step is undone (nothing to compensate).
- ``RollbackKind.SAGA``      the tool changes the outside world now and returns a
  `compensation` (JSON); `compensate(compensation)` undoes it. Must be idempotent.
- ``RollbackKind.EFFECT``    the tool stages effects with `ctx.stage_effect`; they are
  sent after commit and simply discarded on rollback.
- ``RollbackKind.READ_ONLY`` nothing to undo.

Failures: raise `ToolError(message)` (or any exception; its text is used). The message
is classified by the error cleaner, so PostgreSQL-, POSIX- or serde-style wording gets
precise hints (e.g. ``duplicate key value violates unique constraint "t_pkey"``).

Third-party packages register tools through the ``agenttx.tools`` entry-point group,
each entry point naming a Tool subclass (see docs/tools.md and examples/).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ..engine.jsonargs import describe


class RollbackKind(enum.Enum):
    JOURNAL = "journal"
    SAGA = "saga"
    EFFECT = "effect"
    READ_ONLY = "read_only"


class ToolError(Exception):
    """A tool failure with a raw message for the cleaner.

    `argument` names the argument (dotted path) whose value caused the failure, and
    `data` the data id (e.g. ``kv:cart``); the engine uses both to find the culprit step.
    """

    def __init__(self, message: str, *, argument: str | None = None,
                 data: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.argument = argument
        self.data = data


# ---- argument model ----------------------------------------------------------------

class ArgType(enum.Enum):
    STRING = "a string"
    ID = "a string or number"
    OBJECT = "a map"
    ANY = "any JSON value"


@dataclass(frozen=True)
class Field:
    name: str
    type: ArgType
    required: bool = True
    default: Any = None


def _type_ok(value: Any, kind: ArgType) -> bool:
    if kind is ArgType.ANY:
        return True
    if kind is ArgType.STRING:
        return isinstance(value, str)
    if kind is ArgType.OBJECT:
        return isinstance(value, dict)
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def validate_arguments(args: Mapping[str, Any], fields: Sequence[Field]) -> dict[str, Any]:
    """Check `args` against `fields` with serde's (deny_unknown_fields) messages."""
    by_name = {f.name: f for f in fields}
    for name, value in args.items():
        spec = by_name.get(name)
        if spec is None:
            if not fields:
                raise ToolError(f"unknown field `{name}`, there are no fields", argument=name)
            expected = ", ".join(f"`{f.name}`" for f in fields)
            raise ToolError(f"unknown field `{name}`, expected one of {expected}", argument=name)
        if not _type_ok(value, spec.type):
            raise ToolError(f"invalid type: {describe(value)}, expected {spec.type.value}",
                            argument=name)
    out: dict[str, Any] = {}
    for spec in fields:
        if spec.name in args:
            out[spec.name] = args[spec.name]
        elif spec.required:
            raise ToolError(f"missing field `{spec.name}`", argument=spec.name)
        else:
            out[spec.name] = spec.default
    return out


# ---- what a tool sees ----------------------------------------------------------------

class ToolContext(Protocol):
    """The engine's view for one step: committed data plus this transaction's live writes."""

    tx_id: str
    step_id: int

    async def kv_get(self, key: str) -> tuple[bool, Any]: ...
    async def kv_put(self, key: str, value: Any) -> None: ...
    async def kv_delete(self, key: str) -> bool: ...
    async def record_get(self, table: str, record_id: str | int | float) -> dict[str, Any] | None: ...
    async def record_insert(self, table: str, record_id: str | int | float,
                            fields: dict[str, Any]) -> None: ...
    def stage_effect(self, channel: str, payload: Any, idempotency_key: str | None) -> str: ...


@dataclass
class ToolResult:
    output: Any
    compensation: Any = None  # SAGA tools: handed back to `compensate` on undo
    extra: dict[str, Any] = field(default_factory=dict)


class Tool:
    """Base class for tools. Subclasses set `name`, `fields`, `rollback`, implement `execute`."""

    name: ClassVar[str] = ""
    fields: ClassVar[Sequence[Field]] = ()
    rollback: ClassVar[RollbackKind] = RollbackKind.READ_ONLY
    # Data ids this tool needs from etcd, computed from (unresolved) arguments so the
    # engine can fetch them in the step's first round trip. Optional optimisation.
    def prefetch(self, args: Mapping[str, Any]) -> Sequence[tuple[str, Any]]:
        return ()

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise NotImplementedError

    async def compensate(self, compensation: Any) -> None:
        """Undo a SAGA step. Must be idempotent: undoing twice is a success."""


class FsContext(Protocol):
    """Extra context the built-in fs tools use (sandboxed, saga-undone by the engine)."""

    async def fs_write(self, path: str, contents: str) -> int: ...
    async def fs_read(self, path: str) -> str: ...
