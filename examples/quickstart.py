"""A 60-second tour of AgentTx: run with the service started by `make serve`.

    .venv/bin/python examples/quickstart.py [--target 127.0.0.1:50051]

It begins a transaction, runs a few tool steps (one of which fails and is rolled back
with a hint), commits, and prints every response as a user would see it. It uses the
Python client, `agenttx.client`; see docs/client.md.
"""

from __future__ import annotations

import argparse

from agenttx.client import Client, StepResult


def show(r: StepResult) -> None:
    detail = r.output_json or f"{r.category}: {r.hint}"
    print(f"step {r.step_id:<3} {r.tool:<14} {r.status:<18} {r.strategy:<16} -> {detail}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="127.0.0.1:50051")
    target = parser.parse_args().target

    with Client(target) as client, client.transaction(agent_id="quickstart") as tx:
        print(f"begin    -> transaction {tx.id}, next step {tx.next_step_id}")
        show(tx.step("record.insert", {"table": "customers", "id": 1, "fields": {"name": "Ada"}},
                     context="created the customer"))
        show(tx.step("record.insert", {"table": "orders", "id": "o-1",
                                       "fields": {"customer_id": 2, "total": 42},
                                       "references": {"customer_id": "customers"}}))
        # The hint said customer 2 does not exist; the agent retries the step, changed.
        show(tx.step("record.insert", {"table": "orders", "id": "o-1",
                                       "fields": {"customer_id": "${steps.1.id}", "total": 42},
                                       "references": {"customer_id": "customers"}},
                     context="order for customer 1"))
        show(tx.step("fs.write", {"path": "receipts/o-1.txt", "contents": "order o-1: 42"}))
        show(tx.step("effect.stage", {"channel": "log",
                                      "payload": {"event": "order placed", "id": "o-1"}}))

        state = tx.get()
        print(f"get      -> next step {state.next_step_id}, constraints {list(state.constraints)}")
        done = tx.commit()  # explicit, to print it; leaving the block would commit too
        print(f"commit   -> committed={done.committed} steps={done.steps_committed} "
              f"effects_dispatched={done.effects_dispatched}")


if __name__ == "__main__":
    main()
