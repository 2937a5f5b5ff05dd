"""Run real `agenttx serve` processes for tests (never an in-process fake).

`ServiceProcess` is the public harness, `agenttx.testing.ServiceProcess`; this module
keeps the names the project's tests import and adds `Agent`, a raw-stub client used by
the wire-level tests (the `agenttx.client` package has its own tests).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agenttx.testing import ServiceProcess
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

__all__ = ["Agent", "ServiceProcess"]


class Agent:
    """A tiny client that keeps track of the next step id, like a real agent would."""

    def __init__(self, stub: pb_grpc.AgentTxServiceStub, agent_id: str = "test-agent",
                 metadata: Mapping[str, str] | None = None, **policy: Any) -> None:
        self.stub = stub
        req = pb.BeginTransactionRequest(agent_id=agent_id, metadata=dict(metadata or {}))
        if policy:
            req.policy.CopyFrom(pb.RollbackPolicy(**policy))
        resp = stub.BeginTransaction(req)
        self.tx = resp.transaction_id
        self.next = resp.next_step_id

    def step(self, tool: str, args: Any = None, *, raw: str | None = None, context: str = "",
             step_id: int | None = None, stub: pb_grpc.AgentTxServiceStub | None = None
             ) -> pb.ExecuteStepResponse:
        body = raw if raw is not None else json.dumps(args if args is not None else {})
        resp = (stub or self.stub).ExecuteStep(pb.ExecuteStepRequest(
            transaction_id=self.tx, step_id=self.next if step_id is None else step_id,
            tool_name=tool, arguments_json=body, raw_context=context))
        self.next = resp.next_step_id
        return resp

    def ok(self, tool: str, args: Any = None, **kw: Any) -> Any:
        resp = self.step(tool, args, **kw)
        assert resp.status == pb.STEP_STATUS_SUCCESS, (resp.error_category, resp.clean_hint)
        return json.loads(resp.output_json)

    def commit(self) -> pb.CommitTransactionResponse:
        return self.stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=self.tx))

    def rollback(self, to_step: int | None = None, reason: str = "") -> pb.RollbackTransactionResponse:
        req = pb.RollbackTransactionRequest(transaction_id=self.tx, reason=reason)
        if to_step is not None:
            req.to_step = to_step
        resp = self.stub.RollbackTransaction(req)
        self.next = resp.next_step_id
        return resp

    def get(self) -> pb.GetTransactionResponse:
        return self.stub.GetTransaction(pb.GetTransactionRequest(transaction_id=self.tx))
