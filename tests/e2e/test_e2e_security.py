"""SPEC §9 on a real kind cluster with the chart's defaults: the service refuses calls
without a valid ServiceAccount token and serves the ones with one (from the host, through
a port-forward); the operator published the cluster's issuer keys into the bundled,
mutual-TLS etcd, and a pod's projected token is accepted from inside the cluster, from a
namespace the NetworkPolicy admits.
"""

from __future__ import annotations

import json
import uuid

import grpc
import pytest
from e2e_cluster import AGENT, Cluster, projected_token_agent, service_channel, wait_for

from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

UNAUTH = grpc.StatusCode.UNAUTHENTICATED


def refusal(stub: pb_grpc.AgentTxServiceStub, metadata: tuple[tuple[str, str], ...] = ()
            ) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="e2e"), metadata=metadata,
                              timeout=10)
    return err.value.code(), err.value.details()


def test_unauthenticated_calls_are_refused_and_a_service_account_token_works(
        cluster: Cluster, namespace: str, agent_token: str) -> None:
    vault_token = cluster.token(AGENT, namespace, audience="vault")
    with service_channel(cluster, None) as ch:
        stub = pb_grpc.AgentTxServiceStub(ch)
        assert refusal(stub) == (UNAUTH, "missing credentials")
        assert refusal(stub, (("authorization", "Bearer not-a-token"),)) == (
            UNAUTH, "invalid credentials")
        # Signed by the cluster, but for another audience.
        assert refusal(stub, (("authorization", f"Bearer {vault_token}"),)) == (
            UNAUTH, "invalid credentials")

    agent_id = f"e2e-auth-{uuid.uuid4().hex[:8]}"
    cluster.service_account("other", namespace)
    other_token = cluster.token("other", namespace)
    with service_channel(cluster, agent_token) as ch, \
            service_channel(cluster, other_token) as other_ch:
        stub, other = pb_grpc.AgentTxServiceStub(ch), pb_grpc.AgentTxServiceStub(other_ch)

        def begin() -> pb.BeginTransactionResponse | None:
            try:
                return stub.BeginTransaction(pb.BeginTransactionRequest(agent_id=agent_id),
                                             timeout=10)
            except grpc.RpcError as err:  # the keys reach the service through its watch
                if err.code() in (UNAUTH, grpc.StatusCode.UNAVAILABLE):
                    return None
                raise
        tx = wait_for(begin, 60, "the service to accept the ServiceAccount token", interval=1)
        view = stub.GetTransaction(pb.GetTransactionRequest(transaction_id=tx.transaction_id),
                                   timeout=10)
        assert (view.principal, view.agent_id) == (
            f"system:serviceaccount:{namespace}:{AGENT}", agent_id)

        # Another ServiceAccount of the same namespace gets what an unknown id gets.
        def not_found(tx_id: str) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.RpcError) as err:
                other.GetTransaction(pb.GetTransactionRequest(transaction_id=tx_id), timeout=10)
            return err.value.code(), err.value.details().replace(tx_id, "<id>")
        assert not_found(tx.transaction_id) == not_found(str(uuid.uuid4()))
        assert not_found(tx.transaction_id)[0] == grpc.StatusCode.NOT_FOUND

        # Not an admin (auth.admins is empty by default): its listing holds its own only.
        listed = stub.ListTransactions(pb.ListTransactionsRequest(), timeout=10)
        assert {t.principal for t in listed.transactions} == {
            f"system:serviceaccount:{namespace}:{AGENT}"}
        done = stub.RollbackTransaction(pb.RollbackTransactionRequest(
            transaction_id=tx.transaction_id, reason="e2e cleanup"), timeout=10)
        assert done.rolled_back


def test_the_operator_publishes_the_issuer_keys_and_a_projected_token_is_accepted(
        cluster: Cluster, namespace: str) -> None:
    # What the operator published is what the API server serves, read from the bundled
    # etcd over its mutual TLS.
    issuer, kids = cluster.issuer_keys()
    doc = cluster.wait_for_issuer_keys()
    assert doc["issuer"] == issuer
    assert {k.get("kid", "") for k in doc["jwks"]["keys"]} == kids
    assert not any({"d", "p", "q"} & set(k) for k in doc["jwks"]["keys"])  # public keys only

    # A pod with a projected token (audience agenttx), from a namespace the service's
    # NetworkPolicy admits, calling the Service's cluster address.
    cluster.label_client_namespace(namespace)
    cluster.service_account("billing-agent", namespace)
    agent_id = f"e2e-projected-{uuid.uuid4().hex[:8]}"
    for doc_ in projected_token_agent("agent", "billing-agent", agent_id):
        cluster.apply(doc_, namespace)
    phase, logs = cluster.pod_result("agent", namespace)
    assert phase == "Succeeded", logs
    result = json.loads(logs.strip().splitlines()[-1])
    assert result == {
        "anonymous": ["UNAUTHENTICATED", "missing credentials"],
        "principal": f"system:serviceaccount:{namespace}:billing-agent",
        "agent_id": agent_id,
        "rolled_back": True,
    }, logs
