"""Toolsets on a real kind cluster: `kubectl apply -f examples/toolsets/` (an upstream MCP
server Deployment, its Secret, the `tickets` and `mail` AgentTxToolsets) in a fresh
namespace; both become Ready/Published; an agent (a ServiceAccount token of that
namespace, over a port-forward with the real gRPC API) creates a ticket through AgentTx,
a later step fails, the agent rolls back, and the ticket is closed: AgentTx called the
compensation on the upstream, with the header the operator projected from the Secret.

The CRD's own rules (CEL included) are checked by the real API server: every
examples/toolsets/invalid/ file is refused at `kubectl apply`.
"""

from __future__ import annotations

import json
import pathlib
import uuid

import pytest
from e2e_cluster import RELEASE, ROOT, SYSTEM_NS, Cluster, service_channel, wait_for

from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "examples" / "toolsets"


def step(stub: pb_grpc.AgentTxServiceStub, tx: str, step_id: int, tool: str,
         args: dict) -> pb.ExecuteStepResponse:
    return stub.ExecuteStep(pb.ExecuteStepRequest(
        transaction_id=tx, step_id=step_id, tool_name=tool, arguments_json=json.dumps(args)),
        timeout=30)


def test_example_toolsets_are_published_and_a_rollback_closes_the_ticket(
        cluster: Cluster, namespace: str, agent_token: str) -> None:
    # As documented, with the namespace the upstream URLs name changed to the test's.
    for path in sorted(EXAMPLES.glob("*.yaml")):
        cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        input=path.read_text().replace(".team-a.svc", f".{namespace}.svc"))
    cluster.kubectl("rollout", "status", "-n", namespace, "deployment/tickets-upstream",
                    "--timeout=300s", timeout=320)
    tickets = cluster.toolset_ready("tickets", namespace)
    mail = cluster.toolset_ready("mail", namespace)
    assert (tickets["status"]["publishedGeneration"], tickets["status"]["tools"]) == (1, 3)
    assert (mail["status"]["publishedGeneration"], mail["status"]["tools"]) == (1, 1)
    copy_ns, copy_name = tickets["status"]["headerSecret"].split("/")
    assert copy_ns == SYSTEM_NS and cluster.get("secret", copy_name, SYSTEM_NS) is not None
    assert mail["status"]["headerSecret"] == ""

    # `kubectl get attool` shows the columns; no status or event holds the token.
    table = cluster.kubectl("get", "attool", "-n", namespace).stdout
    assert table.split("\n")[0].split() == ["NAME", "UPSTREAM", "TOOLS", "READY", "AGE"]
    described = cluster.kubectl("describe", "attool", "-n", namespace).stdout
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    for text in (json.dumps(tickets), json.dumps(mail), described, events):
        assert "example-token" not in text

    title = f"e2e {uuid.uuid4().hex[:8]}"
    with service_channel(cluster, agent_token) as ch:
        stub = pb_grpc.AgentTxServiceStub(ch)

        def listed() -> dict[str, pb.ToolInfo]:
            tools = stub.ListTools(pb.ListToolsRequest(), timeout=10).tools
            found = {t.name: t for t in tools if t.toolset}
            return found if "tickets.create_ticket" in found else {}
        found = wait_for(listed, 120, "the service lists the published toolsets", interval=2)
        assert found["tickets.create_ticket"].kind == "saga"
        assert found["tickets.create_ticket"].toolset == f"{namespace}/tickets"
        assert found["mail.send_email"].kind == "deferred"

        tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="e2e-toolsets"),
                                   timeout=10).transaction_id
        created = step(stub, tx, 1, "tickets.create_ticket", {"title": title})
        assert created.status == pb.STEP_STATUS_SUCCESS, created.clean_hint
        ticket_id = json.loads(created.output_json)["id"]
        failed = step(stub, tx, 2, "kv.get", {"key": f"missing-{uuid.uuid4().hex}"})
        assert failed.status != pb.STEP_STATUS_SUCCESS and failed.error_category == \
            "no_data_found"
        rolled = stub.RollbackTransaction(pb.RollbackTransactionRequest(
            transaction_id=tx, reason="e2e: the agent gives up"), timeout=60)
        assert rolled.rolled_back and list(rolled.compensation_errors) == []
        assert rolled.compensations_run == 1

        check = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="e2e-toolsets"),
                                      timeout=10).transaction_id
        search = step(stub, check, 1, "tickets.search_tickets", {"query": title})
        assert search.status == pb.STEP_STATUS_SUCCESS, search.clean_hint
        assert json.loads(search.output_json)["tickets"] == [
            {"id": ticket_id, "title": title, "priority": 3, "status": "closed"}]
        stub.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=check),
                                 timeout=30)

    logs = cluster.kubectl("logs", "-n", namespace, "deployment/tickets-upstream").stdout
    assert logs.count(f"tickets close_ticket id={ticket_id!r} reason='rolled back by AgentTx'") == 1

    # Deleting a toolset unpublishes it and removes its header files.
    cluster.delete("agenttxtoolset", "tickets", namespace)
    wait_for(lambda: cluster.get("secret", copy_name, SYSTEM_NS) is None, 300,
             f"the header copy {copy_name} deleted")
    dep = cluster.get("deployment", RELEASE, SYSTEM_NS)
    assert dep is not None
    assert f"/etc/agenttx/toolsets/{namespace}/tickets" not in [
        m["mountPath"] for c in dep["spec"]["template"]["spec"]["containers"]
        for m in c.get("volumeMounts", [])]
    with service_channel(cluster, agent_token) as ch:
        stub = pb_grpc.AgentTxServiceStub(ch)
        wait_for(lambda: not [t for t in stub.ListTools(pb.ListToolsRequest(), timeout=10).tools
                              if t.name.startswith("tickets.")],
                 120, "tickets.* gone from ListTools", interval=2)


def test_invalid_toolsets_are_refused_by_the_api_server(cluster: Cluster,
                                                      namespace: str) -> None:
    paths = sorted((EXAMPLES / "invalid").glob("*.yaml"))
    assert paths
    for path in paths:
        proc = cluster.kubectl("apply", "-n", namespace, "-f",
                               str(pathlib.Path(path).relative_to(ROOT)), check=False)
        assert proc.returncode != 0, f"{path.name} was accepted"
        assert "is invalid" in proc.stderr or "unknown field" in proc.stderr, proc.stderr
