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

The argument model is either a sequence of `Field` (what the built-ins use; `execute`
gets a dict) or a pydantic model, ideally a `ToolArguments` subclass (`execute` gets a
validated instance). Either way validation runs in strict mode against the arguments
after `${steps…}` references are resolved, and failures read like serde's
(``missing field `id```, ``unknown field `x`, expected one of …``, ``invalid type:
string "5", expected an integer``), so users' tools get the built-ins' hints.

Failures: raise `ToolError(message)` (or any exception; its text is used). The message
is classified by the error cleaner, so PostgreSQL-, POSIX- or serde-style wording gets
precise hints (e.g. ``duplicate key value violates unique constraint "t_pkey"``). A tool
that knows its category states it (`category=`): it is kept, never re-guessed from the
words (docs/tools.md, "Errors").

Third-party packages register tools through the ``agenttx.tools`` entry-point group,
each entry point naming a Tool subclass (see docs/tools.md and examples/).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from ..args.jsonargs import describe

# The categories the built-in tools state for their own failures (PostgreSQL condition
# names; the cleaner's CATEGORIES). A tool that knows its category says so instead of
# leaving the cleaner to guess it from the words.
INVALID_PARAMETER_VALUE = "invalid_parameter_value"
NO_DATA_FOUND = "no_data_found"
UNDEFINED_FILE = "undefined_file"


class RollbackKind(enum.Enum):
    JOURNAL = "journal"
    SAGA = "saga"
    EFFECT = "effect"
    READ_ONLY = "read_only"


class ToolError(Exception):
    """A tool failure with a raw message for the cleaner.

    `argument` names the argument (dotted path) whose value caused the failure, and
    `data` the data id (e.g. ``kv:cart``); the engine uses both to find the culprit step.
    `category` (a PostgreSQL condition name, e.g. ``fdw_error``) is for a tool that knows
    the category for certain; the built-ins always state it. The cleaner keeps it: when
    the message's wording is one it knows for that same category it still builds its
    precise hint from the message (the values, what to do), else the hint is the message
    made one line. Without a category the cleaner classifies the text.
    """

    def __init__(self, message: str, *, argument: str | None = None,
                 data: str | None = None, category: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.argument = argument
        self.data = data
        self.category = category


class OutcomeUnknown(ToolError):
    """A SAGA tool's action may have happened although the tool cannot say so (its call
    timed out, the connection dropped after the request was sent). The engine cannot
    simply fail the step: it settles the tool's durable intent instead (compensate from
    the arguments, or wait for a manual rollback; docs/toolsets.md)."""


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


class ToolArguments(BaseModel):
    """Base for a custom tool's pydantic argument model: unknown fields are refused (serde's
    deny_unknown_fields, like the built-ins) and the validated instance is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# None: the tool checks its own arguments in `execute` (a toolset tool, against its
# upstream's inputSchema); it gets them as a dict.
ArgumentModel = Sequence[Field] | type[BaseModel] | None


def validate_arguments(args: Mapping[str, Any], fields: ArgumentModel) -> Any:
    """Check `args` against the tool's argument model with serde's messages.

    `fields` is a sequence of `Field` (returns a dict with defaults filled in) or a
    pydantic model class (returns a validated instance; strict mode, so `"5"` is not an
    integer, as in serde). Raises ToolError naming the offending argument. None (tools
    that check their own arguments): the arguments as a dict.
    """
    if fields is None:
        return dict(args)
    if isinstance(fields, type) and issubclass(fields, BaseModel):
        return _validate_model(args, fields)
    by_name = _by_name(fields)
    for name, value in args.items():
        spec = by_name.get(name)
        if spec is None:
            if not fields:
                raise ToolError(f"unknown field `{name}`, there are no fields", argument=name,
                                category=INVALID_PARAMETER_VALUE)
            expected = ", ".join(f"`{f.name}`" for f in fields)
            raise ToolError(f"unknown field `{name}`, expected one of {expected}", argument=name,
                            category=INVALID_PARAMETER_VALUE)
        if not _type_ok(value, spec.type):
            # serde_path_to_error's `<path>: ` prefix, so the hint can name the argument
            raise ToolError(f"{name}: invalid type: {describe(value)}, expected {spec.type.value}",
                            argument=name, category=INVALID_PARAMETER_VALUE)
    out: dict[str, Any] = {}
    for spec in fields:
        if spec.name in args:
            out[spec.name] = args[spec.name]
        elif spec.required:
            raise ToolError(f"missing field `{spec.name}`", argument=spec.name,
                            category=INVALID_PARAMETER_VALUE)
        else:
            out[spec.name] = spec.default
    return out


# A tool's fields by name, built once per tool rather than on every step: keyed by the
# identity of the fields sequence, which is kept alive by the entry (a tool's `fields` is
# a class attribute, so the cache holds one entry per tool).
_BY_NAME: dict[int, tuple[Sequence[Field], dict[str, Field]]] = {}


def _by_name(fields: Sequence[Field]) -> dict[str, Field]:
    hit = _BY_NAME.get(id(fields))
    if hit is not None and hit[0] is fields:
        return hit[1]
    if len(_BY_NAME) >= 4096:  # fields built per call by some custom tool: stay bounded
        _BY_NAME.clear()
    by_name = {f.name: f for f in fields}
    _BY_NAME[id(fields)] = (fields, by_name)
    return by_name


_PYDANTIC_TYPES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "dict_type": "a map",
    "model_type": "a map",
    "model_attributes_type": "a map",
    "list_type": "a sequence",
    "tuple_type": "a sequence",
    "none_required": "null",
}
# Reported first, like serde: unknown fields and bad values as met, missing fields last.
_PYDANTIC_ORDER = {"extra_forbidden": 0, "missing": 2}


def _validate_model(args: Mapping[str, Any], model: type[BaseModel]) -> BaseModel:
    try:
        # the parsed arguments are already a dict: validated as they are, not copied first
        return model.model_validate(args if type(args) is dict else dict(args), strict=True)
    except ValidationError as exc:
        errors = sorted(exc.errors(include_url=False),
                        key=lambda e: _PYDANTIC_ORDER.get(e["type"], 1))
        message, argument = _serde_message(errors[0], model)
        raise ToolError(message, argument=argument, category=INVALID_PARAMETER_VALUE) from None


def _serde_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _serde_message(err: Any, model: type[BaseModel]) -> tuple[str, str]:
    """One pydantic error -> (serde-style message, argument path).

    The message carries serde_path_to_error's `<path>: ` prefix (`tags[1]`, `address`): the
    enclosing object's path for missing and unknown fields (their message names the
    field), the value's own path otherwise. The argument path is dotted (`tags.1`), as the
    engine's `${steps…}` provenance spells it."""
    loc = list(err["loc"])
    path = ".".join(str(part) for part in loc)
    name = str(loc[-1]) if loc else ""
    shown, parent = _serde_path(loc), _serde_path(loc[:-1])
    kind, value = err["type"], err.get("input")
    where, at = (f"{parent}: " if parent else ""), (f"{shown}: " if shown else "")
    if kind == "missing":
        return f"{where}missing field `{name}`", path
    if kind == "extra_forbidden":
        if parent:
            return f"{where}unknown field `{name}`", path
        expected = ", ".join(f"`{f.alias or n}`" for n, f in model.model_fields.items())
        tail = f", expected one of {expected}" if expected else ", there are no fields"
        return f"unknown field `{name}`{tail}", path
    if kind in _PYDANTIC_TYPES:
        return f"{at}invalid type: {describe(value)}, expected {_PYDANTIC_TYPES[kind]}", path
    if kind in ("literal_error", "enum"):
        allowed = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        if isinstance(value, str) and allowed:
            choices = ", ".join(f"`{a}`" for a in allowed)
            return f"{at}unknown variant `{value}`, expected one of {choices}", path
    msg = str(err.get("msg", "is invalid"))
    if kind == "string_pattern_mismatch":
        expected = f"a string matching {(err.get('ctx') or {}).get('pattern', '')}"
    elif msg.startswith("Input should be "):
        expected = msg[len("Input should be "):]
        if not expected.startswith(("a ", "an ", "'")):
            expected = f"a value {expected}"
    elif msg.startswith("String should have "):
        expected = "a string with " + msg[len("String should have "):]
    elif msg.startswith("List should have "):
        expected = "a sequence with " + msg[len("List should have "):]
    elif msg.startswith("Value error, "):
        expected = "a valid value (" + msg[len("Value error, "):] + ")"
    else:
        expected = f"a valid value ({msg})"
    return f"{at}invalid value: {describe(value)}, expected {expected}", path


# ---- what a tool sees ----------------------------------------------------------------

class ToolContext(Protocol):
    """The engine's view for one step: committed data plus this transaction's live writes.

    `fs_root` is the transaction's sandbox directory (the server's --fs-root, or the
    matching policy's sandbox): a SAGA tool that keeps files may put them under it.
    """

    tx_id: str
    step_id: int
    fs_root: str

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
    """Base class for tools. Subclasses set `name`, `fields`, `rollback`, implement `execute`
    (and `compensate` for SAGA tools)."""

    name: ClassVar[str] = ""
    # A sequence of Field (execute gets a dict) or a pydantic model (execute gets an instance).
    fields: ClassVar[ArgumentModel] = ()
    rollback: ClassVar[RollbackKind] = RollbackKind.READ_ONLY
    # Data ids this tool needs from etcd, computed from (unresolved) arguments so the
    # engine can fetch them in the step's first round trip. Optional optimisation.
    def prefetch(self, args: Mapping[str, Any]) -> Sequence[tuple[str, Any]]:
        return ()

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        raise NotImplementedError

    async def compensate(self, compensation: Any) -> None:
        """Undo a SAGA step. Must be idempotent: undoing twice is a success."""


class StagingContext(Protocol):
    """What toolset tools use beyond ToolContext (implemented by the engine's view)."""

    tx_id: str
    step_id: int
    attempt: str      # this attempt's nonce: `<tx>/<step>/<attempt>` keys the upstream call

    def stage_deferred(self, channel: str, payload: Any) -> str: ...
    async def record_intent(self, intent: dict[str, Any], timeout_s: float) -> None: ...


class FsContext(Protocol):
    """Extra context the built-in fs tools use (sandboxed, saga-undone by the engine)."""

    async def fs_write(self, path: str, contents: str) -> int: ...
    async def fs_read(self, path: str) -> str: ...
