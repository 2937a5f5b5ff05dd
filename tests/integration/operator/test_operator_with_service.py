"""Operator -> etcd -> a real service replica: a transaction begun after the operator
publishes a policy runs under its rollback settings and in its sandbox, and falls back
to the server defaults once the policy is deleted.

The operator runs for real (kopf against kmock, in its own thread and loop); the replica
is a real `agenttx serve` process from tests/integration/conftest.py, watching the same
etcd prefix. The policy selects only this test's agent ids, so it cannot leak into other
tests sharing the replicas.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import uuid

import pytest
from operator_kmock import (
    PVCS,
    ApiServer,
    bind_claim_and_roll_out,
    create,
    delete,
    eventually,
    obj,
    policy,
    reason_is,
    running_operator,
)

from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from agenttx_operator import sandboxes
from support.service import ServiceProcess

pytestmark = pytest.mark.kmock(cls=ApiServer)


def service_prefix(replica: ServiceProcess) -> str:
    return replica.args[replica.args.index("--etcd-prefix") + 1]


def first_failure(stub: pb_grpc.AgentTxServiceStub, agent_id: str) -> int:
    tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id=agent_id), timeout=10)
    step = stub.ExecuteStep(pb.ExecuteStepRequest(
        transaction_id=tx.transaction_id, step_id=1, tool_name="kv.get",
        arguments_json=json.dumps({"key": f"missing-{uuid.uuid4().hex}"})), timeout=10)
    assert step.error_category == "no_data_found", step
    if step.next_step_id:
        stub.RollbackTransaction(pb.RollbackTransactionRequest(
            transaction_id=tx.transaction_id), timeout=10)
    return int(step.strategy)


async def strategy_becomes(stub: pb_grpc.AgentTxServiceStub, agent_id: str, want: int) -> None:
    async def check() -> bool:
        return await asyncio.to_thread(first_failure, stub, agent_id) == want
    await eventually(check, timeout=15, what=pb.RollbackStrategy.Name(want))


async def test_replica_applies_published_rollback_settings_until_deleted(
    api: ApiServer, make_config, replicas: tuple[ServiceProcess, ServiceProcess], uniq: str
) -> None:
    a, b = replicas
    agents = f"op-{uniq}-"
    # The service runs with `--etcd-prefix /agenttx-it`; the operator is given the same
    # prefix without the leading slash (`--etcd-prefix agenttx-it`, a common way to
    # write it) and must still publish where the replicas watch.
    assert service_prefix(a).startswith("/")
    config = make_config(etcd_prefix=service_prefix(a).lstrip("/"))
    async with running_operator(config, api):
        await create(api, policy(f"strict-{uniq}", {
            "priority": 1000, "selector": {"agentIdPrefix": agents},
            "rollback": {"maxLocalDepth": 0, "maxGlobalResets": 0}}))
        await eventually(reason_is(api, f"strict-{uniq}", "Published"), what="Published")

        # No local retry and no global reset: the first failure aborts, on both replicas.
        await strategy_becomes(a.stub, agents + "x", pb.ROLLBACK_STRATEGY_ABORT)
        await strategy_becomes(b.stub, agents + "y", pb.ROLLBACK_STRATEGY_ABORT)
        # Agents the policy does not select keep the defaults (local backtrack).
        assert await asyncio.to_thread(first_failure, a.stub, f"other-{uniq}") == \
            pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK

        await delete(api, f"strict-{uniq}")
        await strategy_becomes(a.stub, agents + "x", pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK)


async def test_replica_writes_into_the_policy_sandbox(
    api: ApiServer, make_config, replicas: tuple[ServiceProcess, ServiceProcess], uniq: str,
    tmp_path: pathlib.Path
) -> None:
    a, _ = replicas
    agents = f"sbx-{uniq}-"
    name = f"sandboxed-{uniq}"
    # tmp_path stands in for the pods' /sandboxes; the directory is what the volume mount
    # would provide.
    config = make_config(etcd_prefix=service_prefix(a), sandbox_mount_root=str(tmp_path))
    mount = tmp_path / "team-a" / name
    mount.mkdir(parents=True)
    async with running_operator(config, api):
        await create(api, policy(name, {"priority": 1000, "selector": {"agentIdPrefix": agents},
                                        "sandbox": {"size": "1Gi"}}))
        await eventually(lambda: obj(api, PVCS, "agenttx-system",
                                     sandboxes.claim_name("team-a", name)), what="claim")
        await bind_claim_and_roll_out(api, "team-a", name)
        await eventually(reason_is(api, name, "Published"), what="Published")

        def write() -> pb.ExecuteStepResponse:
            tx = a.stub.BeginTransaction(pb.BeginTransactionRequest(agent_id=agents + "w"))
            step = a.stub.ExecuteStep(pb.ExecuteStepRequest(
                transaction_id=tx.transaction_id, step_id=1, tool_name="fs.write",
                arguments_json=json.dumps({"path": "out/hello.txt", "contents": uniq})))
            a.stub.CommitTransaction(pb.CommitTransactionRequest(
                transaction_id=tx.transaction_id))
            return step

        async def written() -> bool:
            await asyncio.to_thread(write)
            return (mount / "out" / "hello.txt").exists()
        await eventually(written, timeout=15, what="file in the sandbox")
        assert (mount / "out" / "hello.txt").read_text() == uniq
        await delete(api, name)


def commit_a_log_effect(stub: pb_grpc.AgentTxServiceStub, agent_id: str
                        ) -> tuple[str, pb.CommitTransactionResponse]:
    tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id=agent_id), timeout=10)
    step = stub.ExecuteStep(pb.ExecuteStepRequest(
        transaction_id=tx.transaction_id, step_id=1, tool_name="effect.stage",
        arguments_json=json.dumps({"channel": "log", "payload": {"n": 1}})), timeout=10)
    assert step.status == pb.STEP_STATUS_SUCCESS, step
    return tx.transaction_id, stub.CommitTransaction(
        pb.CommitTransactionRequest(transaction_id=tx.transaction_id), timeout=10)


async def test_replica_gates_what_a_published_policy_requires_approval_for(
    api: ApiServer, make_config, replicas: tuple[ServiceProcess, ServiceProcess], uniq: str
) -> None:
    a, b = replicas
    agents = f"appr-{uniq}-"
    name = f"approvals-{uniq}"
    config = make_config(etcd_prefix=service_prefix(a))
    async with running_operator(config, api):
        await create(api, policy(name, {
            "priority": 1000, "selector": {"agentIdPrefix": agents},
            "approval": {"required": [{"channel": "log"}], "timeoutSeconds": 600}}))
        await eventually(reason_is(api, name, "Published"), what="Published")

        async def gated() -> bool:
            tx_id, done = await asyncio.to_thread(commit_a_log_effect, b.stub, agents + "x")
            if not done.awaiting_approval:
                return False
            listed = b.stub.ListApprovals(pb.ListApprovalsRequest(), timeout=10)
            (mine,) = [x for x in listed.approvals if x.transaction_id == tx_id]
            assert mine.digest == done.approval_digest
            assert mine.expires_at - mine.requested_at == pytest.approx(600)
            # no authentication: the anonymous caller is an approver (docs/approvals.md)
            decided = b.stub.DecideApproval(pb.DecideApprovalRequest(
                transaction_id=tx_id, digest=done.approval_digest, approve=True), timeout=10)
            return decided.status == pb.TRANSACTION_STATUS_COMMITTED
        await eventually(gated, timeout=15, what="the commit waits for approval")
        # agents the policy does not select commit at once
        _, other = await asyncio.to_thread(commit_a_log_effect, a.stub, f"other-{uniq}")
        assert other.committed and not other.awaiting_approval

        await delete(api, name)

        async def ungated() -> bool:
            _, done = await asyncio.to_thread(commit_a_log_effect, a.stub, agents + "y")
            return done.committed
        await eventually(ungated, timeout=15, what="no approval once deleted")
