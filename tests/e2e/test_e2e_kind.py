"""AgentTx on a real kind cluster, installed by its Helm chart, driven over a port-forward
with the real gRPC client: a policy's rollback settings and sandbox take effect, change
with the policy, and go away with it.

The chart authenticates (`auth.mode=kubernetes`), so every call carries the token of a
ServiceAccount in the policy's own namespace: policies apply only to principals of
their namespace (docs/security.md#policy-and-sandbox-scope).

The policy's effect is read from the first failing step's strategy: `kv.get` of a missing
key fails with no dependency to jump to, so with the server default (max_local_depth=3)
the strategy is LOCAL_BACKTRACK, with maxLocalDepth 0 a GLOBAL_RESET, and with
maxGlobalResets 0 as well an ABORT.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from e2e_cluster import RELEASE, SYSTEM_NS, Cluster, service_channel, wait_for

from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

LOCAL = pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK
RESET = pb.ROLLBACK_STRATEGY_GLOBAL_RESET
ABORT = pb.ROLLBACK_STRATEGY_ABORT


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "agenttx.io/v1alpha1", "kind": "AgentTxPolicy",
            "metadata": {"name": name}, "spec": spec}


def mount_paths(cluster: Cluster) -> list[str]:
    dep = cluster.get("deployment", RELEASE, SYSTEM_NS)
    assert dep is not None
    return [m["mountPath"] for c in dep["spec"]["template"]["spec"]["containers"]
            for m in c.get("volumeMounts", [])]


def first_failure_strategy(stub: pb_grpc.AgentTxServiceStub, agent_id: str) -> int:
    tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id=agent_id), timeout=10)
    step = stub.ExecuteStep(pb.ExecuteStepRequest(
        transaction_id=tx.transaction_id, step_id=1, tool_name="kv.get",
        arguments_json=json.dumps({"key": f"missing-{uuid.uuid4().hex}"})), timeout=10)
    assert step.status != pb.STEP_STATUS_SUCCESS
    assert step.error_category == "no_data_found"
    if step.next_step_id:
        stub.RollbackTransaction(pb.RollbackTransactionRequest(
            transaction_id=tx.transaction_id, reason="e2e cleanup"), timeout=10)
    return step.strategy


def eventually_strategy(stub: pb_grpc.AgentTxServiceStub, agent_id: str, want: int,
                        timeout: float = 60) -> None:
    """The service picks a published policy up from its etcd watch: allow it a moment."""
    seen: list[int] = []

    def check() -> bool:
        seen.append(first_failure_strategy(stub, agent_id))
        return seen[-1] == want
    try:
        wait_for(check, timeout, f"strategy {pb.RollbackStrategy.Name(want)}", interval=1)
    except AssertionError:
        raise AssertionError(
            f"got {[pb.RollbackStrategy.Name(s) for s in seen[-3:]]}, "
            f"want {pb.RollbackStrategy.Name(want)}") from None


def test_policy_rollback_settings_follow_create_update_delete(
        cluster: Cluster, namespace: str, agent_token: str) -> None:
    prefix = f"e2e-{uuid.uuid4().hex[:8]}-"
    name = "strict"
    cluster.apply(policy(name, {"priority": 100, "selector": {"agentIdPrefix": prefix},
                                "rollback": {"maxLocalDepth": 0}}), namespace)
    body = cluster.policy_ready(name, namespace, generation=1)
    assert body["status"]["observedGeneration"] == 1
    assert body["status"]["conditions"][0]["reason"] == "Published"

    with service_channel(cluster, agent_token) as ch:
        stub = pb_grpc.AgentTxServiceStub(ch)
        # Selected agents get the policy; others keep the server defaults.
        eventually_strategy(stub, prefix + "agent", RESET)
        assert first_failure_strategy(stub, "someone-else") == LOCAL

        # Update: no global reset either -> the first failure aborts.
        cluster.apply(policy(name, {"priority": 100, "selector": {"agentIdPrefix": prefix},
                                    "rollback": {"maxLocalDepth": 0,
                                                 "maxGlobalResets": 0}}), namespace)
        cluster.policy_ready(name, namespace, generation=2)
        eventually_strategy(stub, prefix + "agent", ABORT)

        # Delete: unpublished, back to the server default.
        cluster.delete("agenttxpolicy", name, namespace)
        eventually_strategy(stub, prefix + "agent", LOCAL)


def test_policy_sandbox_is_mounted_used_and_removed(cluster: Cluster, namespace: str,
                                                   agent_token: str) -> None:
    prefix = f"sbx-{uuid.uuid4().hex[:8]}-"
    name = "sandboxed"
    # kind's default StorageClass ("standard", local-path) provisions ReadWriteOnce only;
    # all replicas run on the single node.
    cluster.apply(policy(name, {"priority": 100, "selector": {"agentIdPrefix": prefix},
                                "sandbox": {"size": "64Mi", "accessModes": ["ReadWriteOnce"],
                                            "storageClassName": "standard"}}), namespace)
    body = cluster.policy_ready(name, namespace, generation=1, timeout=420)
    claim_ref = body["status"]["sandboxClaim"]
    claim_ns, claim = claim_ref.split("/")
    assert claim_ns == SYSTEM_NS
    pvc = cluster.get("pvc", claim, SYSTEM_NS)
    assert pvc is not None and pvc["status"]["phase"] == "Bound"
    cluster.rollout()
    mount = f"/sandboxes/{namespace}/{name}"
    assert mount in mount_paths(cluster)

    contents = f"written at {time.time()}"
    with service_channel(cluster, agent_token) as ch:
        stub = pb_grpc.AgentTxServiceStub(ch)
        tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id=prefix + "a"),
                                   timeout=10)
        step = stub.ExecuteStep(pb.ExecuteStepRequest(
            transaction_id=tx.transaction_id, step_id=1, tool_name="fs.write",
            arguments_json=json.dumps({"path": "notes/hello.txt", "contents": contents})),
            timeout=10)
        assert step.status == pb.STEP_STATUS_SUCCESS, step.clean_hint
        commit = stub.CommitTransaction(
            pb.CommitTransactionRequest(transaction_id=tx.transaction_id), timeout=10)
        assert commit.committed

    # The file is in the policy's volume, seen from a service pod.
    shown = cluster.kubectl("exec", "-n", SYSTEM_NS, f"deployment/{RELEASE}", "-c", "agenttx",
                            "--", "cat", f"{mount}/notes/hello.txt")
    assert shown.stdout == contents

    # Delete (reclaimPolicy Delete): unmounted and the claim removed.
    cluster.delete("agenttxpolicy", name, namespace)
    wait_for(lambda: cluster.get("pvc", claim, SYSTEM_NS) is None, 300, f"claim {claim} gone")
    assert mount not in mount_paths(cluster)


def test_out_of_range_policy_is_rejected_by_the_api_server(cluster: Cluster,
                                                         namespace: str) -> None:
    proc = cluster.kubectl("apply", "-n", namespace, "-f",
                           "examples/policies/invalid-max-local-depth.yaml", check=False)
    assert proc.returncode != 0
    assert "maxLocalDepth" in proc.stderr
