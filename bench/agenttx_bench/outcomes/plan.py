"""What a task is: a plan of tool calls whose arguments may depend on earlier outputs.

Why its own module: the agents (for three systems), the oracle's model and the fault
schedule must read one plan the same way. A plan is a list of `Op`s; an argument is a
literal or one of three placeholders, each filled in the way the system at hand allows:

* `Ref(label, path)` — a value from an earlier op's output. An AgentTx agent sends the
  reference itself (`${steps.N.path}`), so the service knows which step produced the
  value (provenance, docs/recovery.md); a baseline agent copies the value, as a model would.
* `Fmt(template)` — a string with `{label.path}` holes (AgentTx: interpolated
  `${steps.N.path}`; strings as-is, anything else as compact JSON, like the service).
* `Calc(fn)` — a value the agent works out itself from earlier outputs (parsing a
  request, arithmetic on a counter it read); every system computes it the same way.

Within one attempt at a task, op *i* is step *i + 1* of the agent's transaction (no
step is ever inserted), so a reference's step number is fixed by the plan.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .state import State

Outputs = Mapping[str, Any]  # op label -> that op's output (the tool's JSON output)

_HOLE = re.compile(r"\{([A-Za-z0-9_]+)((?:\.[A-Za-z0-9_-]+)+)\}")


@dataclass(frozen=True)
class Ref:
    label: str
    path: str  # dotted: "value.customer", "fields.customer_id", "id"


@dataclass(frozen=True)
class Fmt:
    template: str


@dataclass(frozen=True)
class Calc:
    fn: Callable[[Outputs], Any]


@dataclass(frozen=True)
class Op:
    """One planned tool call.

    `group`: the items this op writes belong to that atomic group of the task (see
    `oracle.classify`). `wrong`: path (within `args`) of a value the agent derives and
    could get wrong, which a later op detects as a missing row (the `wrong_value` fault).
    `conflict_delta`: on a `kv.get` of a counter the task writes later, what a concurrent
    writer adds to it (the `commit_conflict` fault)."""

    label: str
    tool: str
    args: Mapping[str, Any]
    group: int = 0
    wrong: tuple[str, ...] | None = None
    conflict_delta: int | None = None


@dataclass(frozen=True)
class Task:
    name: str
    family: str
    ns: str  # the run's namespace prefix, e.g. "run0007/"
    initial: State
    ops: tuple[Op, ...]

    def index_of(self, label: str) -> int:
        for i, op in enumerate(self.ops):
            if op.label == label:
                return i
        raise KeyError(label)

    def op(self, label: str) -> Op:
        return self.ops[self.index_of(label)]

    def file_path(self, i: int) -> str:
        """The literal path op `i` reads or writes (following a Ref to the writing op)."""
        path = self.ops[i].args["path"]
        if isinstance(path, Ref):
            return self.file_path(self.index_of(path.label))
        assert isinstance(path, str), f"{self.name} op {i}: path must be a literal or a Ref"
        return path


def lookup(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def render_local(template: Any, outputs: Outputs) -> Any:
    """Concrete arguments with every placeholder filled in from `outputs`."""
    if isinstance(template, Ref):
        return lookup(outputs[template.label], template.path)
    if isinstance(template, Fmt):
        return _HOLE.sub(lambda m: _text(lookup(outputs[m.group(1)], m.group(2)[1:])),
                         template.template)
    if isinstance(template, Calc):
        return template.fn(outputs)
    if isinstance(template, Mapping):
        return {k: render_local(v, outputs) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [render_local(v, outputs) for v in template]
    return template


def render_agenttx(template: Any, outputs: Outputs, step_of: Mapping[str, int]) -> Any:
    """Arguments for `tx.step`: Refs and Fmt holes become `${steps.N.path}` references
    (N = the step the label ran as), Calcs are computed from `outputs`."""
    if isinstance(template, Ref):
        return f"${{steps.{step_of[template.label]}.{template.path}}}"
    if isinstance(template, Fmt):
        return _HOLE.sub(lambda m: f"${{steps.{step_of[m.group(1)]}{m.group(2)}}}",
                         template.template)
    if isinstance(template, Calc):
        return template.fn(outputs)
    if isinstance(template, Mapping):
        return {k: render_agenttx(v, outputs, step_of) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [render_agenttx(v, outputs, step_of) for v in template]
    return template


def encode(args: Any) -> str:
    """Arguments as the JSON text every system receives."""
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))
