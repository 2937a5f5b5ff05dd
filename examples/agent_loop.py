"""An agent loop on `agenttx.client`: run a plan, let failures steer it, commit or give up.

    .venv/bin/python examples/agent_loop.py [--target 127.0.0.1:50051]

The "model" here is a few rules instead of an LLM, so the run is reproducible; the loop
around it is what a real agent needs:

- every tool call is `tx.step(...)`; the client tracks the step id;
- a failed step is a result: read `category` / `hint` (what a model would read), and
  `next_step_id` says which step to send next. Steps from `next_step_id` on are no
  longer live (a DEPENDENCY_JUMP or GLOBAL_RESET undid them), so they go back on the
  plan, in order;
- `Conflict` at commit means another agent changed the same data first: the transaction
  is gone, so redo the whole task in a new one, reading the data afresh;
- `OutcomeUnknown` means an answer was lost and the client could not prove the call had
  not applied (a step it could prove that for, it re-sent itself): never resend blindly,
  look at `.state`;
- step numbers shift when a repair inserts steps, so the plan names the steps it refers
  to (`${steps.{order}.id}`) and the loop fills in the number at send time.
"""

from __future__ import annotations

import argparse
import json
import re
import uuid
from typing import Any

from agenttx.client import Client, Conflict, OutcomeUnknown, StepResult

Step = tuple[str, str, dict[str, Any]]  # (label, tool, arguments)
LABEL_REF = re.compile(r"\$\{steps\.\{(\w+)\}")


def plan(order_id: str, customer: str) -> list[Step]:
    return [
        ("order", "record.insert", {"table": "orders", "id": order_id,
                                    "fields": {"customer_id": customer, "total": 42},
                                    "references": {"customer_id": "customers"}}),
        ("receipt", "fs.write", {"path": f"receipts/{order_id}.txt", "contents":
                                 f"order {order_id} for ${{steps.{{order}}.fields.customer_id}}"}),
        ("notify", "effect.stage", {"channel": "log", "payload": {"event": "order placed",
                                                                  "order": order_id}}),
    ]


def with_step_numbers(args: dict[str, Any], step_of: dict[str, int]) -> dict[str, Any]:
    """`${steps.{order}.id}` -> `${steps.2.id}`: the step that label ran as, right now."""
    text = LABEL_REF.sub(lambda m: f"${{steps.{step_of[m.group(1)]}", json.dumps(args))
    return dict(json.loads(text))


def repair(step: Step, r: StepResult) -> list[Step]:
    """What the model decides after reading a failure: the steps to run instead."""
    label, tool, args = step
    if r.category == "foreign_key_violation" and tool == "record.insert":
        customer = args["fields"]["customer_id"]
        print(f"  the agent reads the hint and creates customer {customer!r} first")
        return [("customer", "record.insert", {"table": "customers", "id": customer,
                                               "fields": {"name": "Ada"}}), step]
    raise RuntimeError(f"the agent cannot recover from {r.category}: {r.hint}")


def run_task(client: Client, order_id: str, customer: str) -> None:
    for attempt in range(1, 4):
        try:
            with client.transaction(agent_id="example-agent") as tx:
                print(f"attempt {attempt}: transaction {tx.id}")
                todo, live = plan(order_id, customer), []
                step_of: dict[str, int] = {}
                while todo:
                    step = todo.pop(0)
                    label, tool, args = step
                    r = tx.step(tool, with_step_numbers(args, step_of),
                                context=f"{label} for order {order_id}")
                    if r.ok:
                        live.append(step)
                        step_of[label] = r.step_id
                        print(f"  step {r.step_id} {r.tool:<14} ok   {r.output_json}")
                        continue
                    print(f"  step {r.step_id} {r.tool:<14} FAIL {r.category}: {r.hint}")
                    print(f"  -> {r.strategy}, next step {r.next_step_id}")
                    if r.ended:  # ABORT: nothing left; the block will not commit
                        raise RuntimeError(f"aborted: {r.abort_reason}")
                    undone, live = live[r.next_step_id - 1:], live[:r.next_step_id - 1]
                    todo = undone + repair(step, r) + todo
                done = tx.commit()
                print(f"committed: {done.steps_committed} steps, "
                      f"{done.effects_dispatched} effect(s) delivered")
                return
        except Conflict as err:
            print(f"  commit conflict ({err.details}); redoing the task")
        except OutcomeUnknown as err:
            seen = err.state.next_step_id if err.state else "unknown"
            raise RuntimeError(f"lost an answer: {err.details} (next step now {seen})") from err
    raise RuntimeError("gave up after 3 conflicts")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="127.0.0.1:50051")
    ns = parser.parse_args()
    suffix = uuid.uuid4().hex[:6]
    with Client(ns.target) as client:
        run_task(client, order_id=f"o-{suffix}", customer=f"c-{suffix}")


if __name__ == "__main__":
    main()
