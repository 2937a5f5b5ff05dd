"""The correctness oracle: what a task should leave behind, and how to judge what it did.

Why it is separate from the systems it judges: the expected state is computed by a small
pure model of the eight built-in tools over a `State` (dicts), never by running AgentTx
or the baselines' tools, so a bug in either cannot make its own output look right.

The verdict on one run, from its final committed state:

* **correct** — equal to a correct state. The correct states are the task's plan applied
  to its initial state, serialised with the concurrent writers the fault injector
  actually ran (`ExternalWrite`, a read-modify-write of a counter): theirs first, or ours
  first. Both serial orders are correct; an interleaving that loses an update is not.
* **partial** — not correct, but nothing wrong was committed: every item (kv key, row,
  file, effect) holds either its expected value or its *untouched* value (what it would
  hold had the agent done nothing: initial state plus the concurrent writers), and every
  atomic group of the task (an order with its line items, stock, invoice and
  confirmation; one ticket's assignment, load and notice) is all-expected or
  all-untouched. A clean abort is partial.
* **corrupt** — anything else: a value no correct state has, half of a group, an
  effect delivered twice (its payload list differs from the single expected delivery).

Effects: *duplicate* = confirmed deliveries of one idempotency key beyond the first;
*leaked* = a delivered effect the correct state does not have (unknown key or other
payload), or whose group's data did not end as expected (it announces work that was not
committed), counted once per key. A correct run has neither.

Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .plan import Task, render_local
from .state import Delivered, Item, State, digest


class Outcome(enum.StrEnum):
    CORRECT = "correct"
    PARTIAL = "partial"
    CORRUPT = "corrupt"


class ModelError(Exception):
    """The plan itself is inconsistent (a task-suite bug, not a system's failure)."""


@dataclass(frozen=True)
class ExternalWrite:
    """What a concurrent writer did: kv counter `key` += `delta` (read, then write)."""

    key: str
    delta: int


def apply(state: State, tool: str, args: dict[str, Any]) -> Any:
    """The built-in tool `tool` on the model state (outputs as in README.md); returns its output."""
    if tool == "kv.put":
        state.kv[args["key"]] = args.get("value")
        return {"key": args["key"], "value": args.get("value")}
    if tool == "kv.get":
        if args["key"] not in state.kv:
            raise ModelError(f'no row with key={args["key"]} in table "kv"')
        return {"key": args["key"], "value": state.kv[args["key"]]}
    if tool in ("record.insert", "record.get"):
        table, rid = args["table"], args["id"]
        if not isinstance(rid, str):
            raise ModelError(f"record ids in the suite are strings (namespaced), got {rid!r}")
        if tool == "record.get":
            if (table, rid) not in state.rows:
                raise ModelError(f'no row with id={rid} in table "{table}"')
            return {"table": table, "id": rid, "fields": state.rows[(table, rid)]}
        if (table, rid) in state.rows:
            raise ModelError(f"duplicate {table} {rid}")
        fields = dict(args.get("fields") or {})
        for column, ref_table in (args.get("references") or {}).items():
            if (ref_table, fields.get(column)) not in state.rows:
                raise ModelError(f"{table}.{column}={fields.get(column)!r} not in {ref_table}")
        state.rows[(table, rid)] = fields
        return {"table": table, "id": rid, "fields": fields}
    if tool == "fs.write":
        state.files[args["path"]] = args["contents"]
        return {"path": args["path"], "bytes": len(args["contents"].encode("utf-8"))}
    if tool == "fs.read":
        if args["path"] not in state.files:
            raise ModelError(f"No such file or directory: '{args['path']}'")
        return {"path": args["path"], "contents": state.files[args["path"]]}
    if tool == "effect.stage":
        key = args["idempotency_key"]
        state.effects[key] = Delivered(args["channel"], (args.get("payload"),))
        return {"staged": True, "channel": args["channel"], "idempotency_key": key}
    raise ModelError(f"unknown tool {tool}")


def written_item(tool: str, args: dict[str, Any]) -> Item | None:
    """The state item a tool call writes (None for reads)."""
    if tool == "kv.put":
        return ("kv", args["key"])
    if tool == "record.insert":
        return ("row", args["table"], args["id"])
    if tool == "fs.write":
        return ("file", args["path"])
    if tool == "effect.stage":
        return ("effect", args["idempotency_key"])
    return None


def _external(state: State, writes: Iterable[ExternalWrite]) -> None:
    for w in writes:
        state.kv[w.key] = state.kv[w.key] + w.delta


def simulate(task: Task, before: Sequence[ExternalWrite] = (),
             after: Sequence[ExternalWrite] = ()) -> tuple[State, dict[Item, int]]:
    """The final state of the plan run once without faults, with concurrent writes
    serialised before or after it; and the group of every item the plan writes."""
    state = task.initial.copy()
    _external(state, before)
    outputs: dict[str, Any] = {}
    groups: dict[Item, int] = {}
    for op in task.ops:
        args = render_local(op.args, outputs)
        outputs[op.label] = apply(state, op.tool, args)
        item = written_item(op.tool, args)
        if item is not None:
            groups[item] = op.group
    _external(state, after)
    return state, groups


@dataclass(frozen=True)
class Expectation:
    correct: tuple[State, ...]  # first: concurrent writers before the task (AgentTx's order)
    untouched: State
    groups: dict[Item, int]

    @property
    def primary(self) -> State:
        return self.correct[0]


def expect(task: Task, externals: Sequence[ExternalWrite] = ()) -> Expectation:
    theirs_first, groups = simulate(task, before=externals)
    states = [theirs_first]
    if externals:
        ours_first, _ = simulate(task, after=externals)
        if digest(ours_first) != digest(theirs_first):
            states.append(ours_first)
    untouched = task.initial.copy()
    _external(untouched, externals)
    return Expectation(tuple(states), untouched, groups)


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    duplicate_effects: int
    leaked_effects: int
    final_sha256: str
    expected_sha256: str


_ABSENT = object()


def _group_complete(group: int, exp: Expectation, final: dict[Item, Any],
                    expected: dict[Item, Any], untouched: dict[Item, Any],
                    data_only: bool) -> bool | None:
    """True: every changed item of `group` is as expected; False: every one untouched;
    None: mixed (or a value that is neither)."""
    states = set()
    for item, g in exp.groups.items():
        if g != group or (data_only and item[0] == "effect"):
            continue
        want, base = expected.get(item, _ABSENT), untouched.get(item, _ABSENT)
        if want == base:
            continue
        got = final.get(item, _ABSENT)
        states.add(True if got == want else False if got == base else None)
    if not states:
        return True
    return states.pop() if len(states) == 1 else None


def classify(final: State, exp: Expectation) -> Outcome:
    if any(digest(final) == digest(c) for c in exp.correct):
        return Outcome.CORRECT
    got, want, base = final.as_map(), exp.primary.as_map(), exp.untouched.as_map()
    for item in set(got) | set(want) | set(base):
        value = got.get(item, _ABSENT)
        if value != want.get(item, _ABSENT) and value != base.get(item, _ABSENT):
            return Outcome.CORRUPT
    for group in set(exp.groups.values()):
        if _group_complete(group, exp, got, want, base, data_only=False) is None:
            return Outcome.CORRUPT
    return Outcome.PARTIAL


def duplicates(final: State) -> int:
    return sum(max(0, len(e.payloads) - 1) for e in final.effects.values())


def leaked(final: State, exp: Expectation) -> int:
    if any(digest(final) == digest(c) for c in exp.correct):
        return 0
    got, want, base = final.as_map(), exp.primary.as_map(), exp.untouched.as_map()
    count = 0
    for key, eff in final.effects.items():
        if not eff.payloads:
            continue
        expected = exp.primary.effects.get(key)
        if expected is None or expected.channel != eff.channel \
                or expected.payloads[0] != eff.payloads[0]:
            count += 1
            continue
        group = exp.groups.get(("effect", key), 0)
        if _group_complete(group, exp, got, want, base, data_only=True) is not True:
            count += 1
    return count


def judge(final: State, exp: Expectation, ns: str) -> Verdict:
    """The verdict on one run; hashes are of the namespace-free canonical form."""
    outcome = classify(final, exp)
    final_sha = digest(final, ns)
    shas = [digest(c, ns) for c in exp.correct]
    expected_sha = final_sha if final_sha in shas else shas[0]
    return Verdict(outcome, duplicates(final), leaked(final, exp), final_sha, expected_sha)
