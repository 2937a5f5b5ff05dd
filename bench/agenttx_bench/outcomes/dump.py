"""Read back what a run left behind, as a user of each system would: the items a task
can touch, read from AgentTx through its client, and from the baselines' own storage.

Why by item and not by scanning storage: a benchmark is a user, not a part
(docs/benchmarks.md), so AgentTx's state is read the way any client reads it — one
read-only transaction of `kv.get` / `record.get` / `fs.read` steps, rolled back at the
end — never from its etcd layout or its sandbox's internals. A client cannot list keys,
so the reader needs the list of everything a run could have written: `items_of(task)`,
the task's initial items plus the target of every write its plan makes. In this suite
every write target (kv key, table and id, file path) is a literal of the plan — faults
and wrong values change what is written, never where — and `items_of` refuses a plan
where that is not so, since the read-back would then miss what it wrote. The baselines'
storage (`direct`) is read over the very same items, so both are judged alike; effects
come from the webhook receiver's log for all systems.

What it must never do: write anything that stays (the read transaction is rolled back),
or read uncommitted state: a transaction sees committed data plus its own writes, and
this one writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agenttx.client import Client, Policy

from .plan import Task
from .state import State

# The plan's write tools -> the arguments naming what they write.
WRITE_TARGETS = {"kv.put": ("key",), "kv.delete": ("key",), "record.insert": ("table", "id"),
                 "fs.write": ("path",)}
# The read for each kind of item, and the category that means "absent" (docs/recovery.md).
ABSENT = {"kv.get": "no_data_found", "record.get": "no_data_found", "fs.read": "undefined_file"}
READ_AGENT = "outcomes/read-back"
# A missing item is a failed read step; with the default policy a few in a row would
# end in a global reset or an abort (docs/recovery.md). Reads undo nothing, so the
# read-back asks for the widest policy the API allows (and begins again if it ends).
READ_POLICY = Policy(max_local_depth=16, max_global_resets=16, replay_budget_factor=1000.0)


class ReadBackError(Exception):
    """A read failed for another reason than the item being absent: the run cannot be
    judged."""


@dataclass(frozen=True)
class Items:
    """What a run of one task can leave behind (besides effects): kv keys, (table, id)
    rows and file paths, sorted."""

    kv: tuple[str, ...]
    rows: tuple[tuple[str, str], ...]
    files: tuple[str, ...]


def items_of(task: Task) -> Items:
    """The task's initial items plus every write target of its plan (pure)."""
    kv, rows, files = set(task.initial.kv), set(task.initial.rows), set(task.initial.files)
    for op in task.ops:
        names = WRITE_TARGETS.get(op.tool)
        if names is None:
            continue
        target = [op.args.get(name) for name in names]
        strings = [t for t in target if isinstance(t, str)]
        if len(strings) != len(target):
            raise ValueError(f"{task.name} op {op.label}: {op.tool} writes to a target that is "
                             "not a literal string; the read-back could not find it")
        if op.tool == "record.insert":
            rows.add((strings[0], strings[1]))
        elif op.tool == "fs.write":
            files.add(strings[0])
        else:
            kv.add(strings[0])
    return Items(tuple(sorted(kv)), tuple(sorted(rows)), tuple(sorted(files)))


def reads(items: Items) -> list[tuple[str, dict[str, Any]]]:
    """The read step for every item, as (tool, arguments)."""
    return ([("kv.get", {"key": k}) for k in items.kv]
            + [("record.get", {"table": t, "id": i}) for t, i in items.rows]
            + [("fs.read", {"path": p}) for p in items.files])


def _keep(state: State, tool: str, args: dict[str, Any], output: Any) -> None:
    if tool == "kv.get":
        state.kv[args["key"]] = output["value"]
    elif tool == "record.get":
        state.rows[(args["table"], args["id"])] = output["fields"]
    else:
        state.files[args["path"]] = output["contents"]


def read_agenttx(client: Client, items: Items) -> State:
    """The committed value of every item, through AgentTx's API: one read-only
    transaction (a new one if the service ends it), rolled back at the end."""
    state = State()
    tx = client.begin(agent_id=READ_AGENT, policy=READ_POLICY)
    try:
        for tool, args in reads(items):
            r = tx.step(tool, args)
            if r.ok:
                _keep(state, tool, args, r.output)
            elif r.category != ABSENT[tool]:
                raise ReadBackError(f"{tool} {args}: {r.category}: {r.hint}")
            if r.ended:
                tx = client.begin(agent_id=READ_AGENT, policy=READ_POLICY)
    finally:
        if not tx.finished:
            tx.rollback(reason="outcomes read-back: nothing to keep")
    return state
