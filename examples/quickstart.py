"""A 60-second tour of AgentTx: run with the service started by `make serve`.

    .venv/bin/python examples/quickstart.py [--target 127.0.0.1:50051]

It begins a transaction, runs a few tool steps (one of which fails and is rolled back
with a hint), commits, and prints every response as a user would see it.
"""

from __future__ import annotations

import argparse
import json

import grpc

from agenttx._proto import agenttx_pb2 as pb
from agenttx._proto import agenttx_pb2_grpc as pb_grpc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="127.0.0.1:50051")
    target = parser.parse_args().target
    stub = pb_grpc.AgentTxServiceStub(grpc.insecure_channel(target))

    tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="quickstart"))
    print(f"begin    -> transaction {tx.transaction_id}, next step {tx.next_step_id}")
    next_step = tx.next_step_id

    def step(tool: str, args: dict, context: str = "") -> pb.ExecuteStepResponse:
        nonlocal next_step
        r = stub.ExecuteStep(pb.ExecuteStepRequest(
            transaction_id=tx.transaction_id, step_id=next_step, tool_name=tool,
            arguments_json=json.dumps(args), raw_context=context))
        status = pb.StepStatus.Name(r.status).removeprefix("STEP_STATUS_")
        detail = r.output_json or f"{r.error_category}: {r.clean_hint}"
        strategy = pb.RollbackStrategy.Name(r.strategy).removeprefix("ROLLBACK_STRATEGY_")
        print(f"step {next_step:<3} {tool:<14} {status:<18} {strategy:<16} -> {detail}")
        next_step = r.next_step_id
        return r

    step("record.insert", {"table": "customers", "id": 1, "fields": {"name": "Ada"}},
         "created the customer")
    step("record.insert", {"table": "orders", "id": "o-1",
                           "fields": {"customer_id": 2, "total": 42},
                           "references": {"customer_id": "customers"}})
    # The hint said customer 2 does not exist; the agent retries the step, changed.
    step("record.insert", {"table": "orders", "id": "o-1",
                           "fields": {"customer_id": "${steps.1.id}", "total": 42},
                           "references": {"customer_id": "customers"}}, "order for customer 1")
    step("fs.write", {"path": "receipts/o-1.txt", "contents": "order o-1: 42"})
    step("effect.stage", {"channel": "log", "payload": {"event": "order placed", "id": "o-1"}})

    state = stub.GetTransaction(pb.GetTransactionRequest(transaction_id=tx.transaction_id))
    print(f"get      -> next step {state.next_step_id}, constraints {list(state.constraints)}")
    done = stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx.transaction_id))
    print(f"commit   -> committed={done.committed} steps={done.steps_committed} "
          f"effects_dispatched={done.effects_dispatched}")


if __name__ == "__main__":
    main()
