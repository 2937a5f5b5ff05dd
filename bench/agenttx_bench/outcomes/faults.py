"""The seeded fault schedule: which planned tool call of which task gets which fault.

Why it is a pure function of (seed, task name, op index): the three systems must get
exactly the same faults, and a rerun with the same seed the same schedule. Each planned
op draws one uniform number u = sha256(seed, task, op, "fire"); the op gets a fault when
u < p, so the faults at p = 0.1 are a subset of those at 0.3 and 0.5. The kind is then
drawn (uniformly, by another hash) among the kinds that can happen at that op:

* ``transient`` (any op): the call fails once and succeeds when re-sent. It is made the
  way a model makes it — its first emission is malformed (an argument name misspelled,
  the JSON cut short, a required argument left out) — so every system sees a real error
  from its argument checks (the baselines' own refuse exactly what AgentTx's refuse).
* ``replica_kill`` (any op): the AgentTx replica the agent talks to is SIGKILLed right
  before the call (the agent must move to the other replica). The baselines run their
  tools in-process, so for them a killed server is a call that fails, not applied.
* ``wrong_value`` (an op with `Op.wrong`): the agent derives a wrong id on its first
  try (a doubled character); a later op finds the row missing (FK / no_data_found).
* ``missing_file`` (an `fs.read` of a file the task wrote): something deletes the file
  right before it is read back.
* ``lock_contention`` (an `fs.write`): another agent is writing the same file during the
  call, and abandons its draft afterwards.
* ``commit_conflict`` (a `kv.get` of a counter the task writes later): a concurrent
  writer commits a change to the counter right after the agent read it.
* ``receiver_failure`` (an `effect.stage` to the webhook): the receiver answers 503 to
  the next two deliveries of that idempotency key.

A fault fires at the first attempt of its op only (per system run); re-sent and redone
calls are clean, as after a real transient failure.

Pure: no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .plan import Ref, Task


class FaultKind(enum.StrEnum):
    TRANSIENT = "transient"
    WRONG_VALUE = "wrong_value"
    MISSING_FILE = "missing_file"
    LOCK_CONTENTION = "lock_contention"
    REPLICA_KILL = "replica_kill"
    COMMIT_CONFLICT = "commit_conflict"
    RECEIVER_FAILURE = "receiver_failure"


# How a transient fault garbles the first emission of a call (Fault.variant).
GARBLES = ("misspelled argument", "truncated JSON", "missing argument")
# The receiver refuses this many deliveries of the key before it recovers.
RECEIVER_FAILURES = 2


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    task: str
    op_index: int
    variant: int = 0


def applicable(task: Task, i: int) -> tuple[FaultKind, ...]:
    """The fault kinds that can happen at op `i` of `task`, in a fixed order."""
    op = task.ops[i]
    kinds = [FaultKind.TRANSIENT, FaultKind.REPLICA_KILL]
    if op.wrong:
        kinds.append(FaultKind.WRONG_VALUE)
    if op.tool == "fs.read" and isinstance(op.args.get("path"), Ref) \
            and task.op(op.args["path"].label).tool == "fs.write":
        kinds.append(FaultKind.MISSING_FILE)
    if op.tool == "fs.write":
        kinds.append(FaultKind.LOCK_CONTENTION)
    if op.tool == "kv.get" and op.conflict_delta is not None:
        kinds.append(FaultKind.COMMIT_CONFLICT)
    if op.tool == "effect.stage" and op.args.get("channel") == "webhook":
        kinds.append(FaultKind.RECEIVER_FAILURE)
    return tuple(kinds)


def unit(*parts: object) -> float:
    """A uniform number in [0, 1) determined by `parts` alone (any process, any run)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class FaultSchedule:
    """Faults for every task at rate `p`: `for_task(name)` maps op index -> Fault."""

    def __init__(self, seed: int, p: float, tasks: Sequence[Task]) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be within [0, 1], got {p}")
        self.seed, self.p = seed, p
        self._faults: dict[str, dict[int, Fault]] = {}
        for task in tasks:
            chosen: dict[int, Fault] = {}
            for i in range(len(task.ops)):
                if unit(seed, task.name, i, "fire") >= p:
                    continue
                kinds = applicable(task, i)
                kind = kinds[int(unit(seed, task.name, i, "kind") * len(kinds))]
                variant = int(unit(seed, task.name, i, "variant") * len(GARBLES))
                chosen[i] = Fault(kind, task.name, i, variant)
            self._faults[task.name] = chosen

    def for_task(self, name: str) -> Mapping[int, Fault]:
        return self._faults.get(name, {})

    def all(self) -> list[Fault]:
        return [f for faults in self._faults.values() for f in faults.values()]

    def counts(self) -> dict[str, int]:
        c = Counter(f.kind.value for f in self.all())
        return {k.value: c.get(k.value, 0) for k in FaultKind}


# ---- what a fault does to a call the agent emitted ----------------------------------------

def garble(args_text: str, variant: int) -> str:
    """A malformed first emission of the call `args_text` (GARBLES[variant])."""
    if GARBLES[variant % len(GARBLES)] == "truncated JSON":
        return args_text[:-1]
    args: dict[str, Any] = json.loads(args_text)
    first = next(iter(args))
    if GARBLES[variant % len(GARBLES)] == "missing argument":
        del args[first]
    else:
        misspelled = first[0] + first[2] + first[1] + first[3:] if len(first) > 2 else first + "_"
        args = {(misspelled if k == first else k): v for k, v in args.items()}
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def typo(value: str) -> str:
    """A wrong id as a model mistypes one: the first character after the namespace
    doubled (`run0001/c-3` -> `run0001/cc-3`). No id in the suite starts with a double."""
    cut = value.rfind("/") + 1
    return value[:cut] + value[cut:cut + 1] + value[cut:]


def with_wrong_value(args_text: str, path: Sequence[str]) -> str:
    """`args_text` with the string at `path` mistyped (the wrong_value fault)."""
    args = json.loads(args_text)
    node = args
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = typo(node[path[-1]])
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))
