"""A 60-second tour of AgentTx: run with the service started by `make serve`.

    .venv/bin/python examples/quickstart.py [--target 127.0.0.1:50051]

It begins a transaction, runs a few tool steps (one of which fails, and is retried as
its hint says), commits, and prints every answer as a user would see it. Every run uses
fresh ids, so it can be run any number of times. It uses the Python client,
`agenttx.client`; see docs/client.md.
"""

from __future__ import annotations

import argparse
import uuid

from agenttx.client import Client, StepResult


def show(r: StepResult) -> None:
    detail = r.output_json or f"{r.category}: {r.hint}"
    print(f"step {r.step_id:<3} {r.tool:<14} {r.status:<18} {r.strategy:<16} -> {detail}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="127.0.0.1:50051")
    target = parser.parse_args().target
    run = uuid.uuid4().hex[:6]          # fresh ids: the quickstart can run again and again
    customer, order = f"ada-{run}", f"o-{run}"

    with Client(target) as client, client.transaction(agent_id="quickstart") as tx:
        print(f"begin    -> transaction {tx.id}, next step {tx.next_step_id}")
        show(tx.step("record.insert", {"table": "customers", "id": customer,
                                       "fields": {"name": "Ada"}},
                     context="created the customer"))
        # A slip: the order names a customer that does not exist. The step fails, nothing
        # of it applies, and the hint says exactly what is wrong.
        show(tx.step("record.insert", {"table": "orders", "id": order,
                                       "fields": {"customer_id": "ada", "total": 42},
                                       "references": {"customer_id": "customers"}}))
        # The agent reads the hint and retries the step, changed: it references step 1's
        # output instead of guessing the id.
        show(tx.step("record.insert", {"table": "orders", "id": order,
                                       "fields": {"customer_id": "${steps.1.id}", "total": 42},
                                       "references": {"customer_id": "customers"}},
                     context="order for the customer of step 1"))
        show(tx.step("fs.write", {"path": f"receipts/{order}.txt",
                                  "contents": f"order {order}: 42"}))
        show(tx.step("effect.stage", {"channel": "log",
                                      "payload": {"event": "order placed", "id": order}}))

        state = tx.get()
        print(f"get      -> next step {state.next_step_id}, constraints {list(state.constraints)}")
        # Commit explicitly. A step in this block failed; this code recovered from it (the
        # retry above), and says so by committing. Leaving the block without tx.commit()
        # would roll everything back and raise StepFailed, so that work whose author never
        # looked at a failure is never committed.
        done = tx.commit()
        print(f"commit   -> committed={done.committed} steps={done.steps_committed} "
              f"effects_dispatched={done.effects_dispatched}")


if __name__ == "__main__":
    main()
