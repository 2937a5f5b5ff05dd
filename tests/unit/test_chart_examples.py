"""examples/kubernetes/ fits the chart it goes with.

The agent workload must be valid Kubernetes, carry the projected token the chart's
default kubernetes auth expects (audience, lifetime, the file the agent reads), live in
a namespace the chart's NetworkPolicy admits, and dial the chart's Service. The token
Secret and the values files must render with the chart into valid manifests. (Running
the agent script against a real service: tests/integration/test_chart_agent_example.py.)
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from support.chart import CHART, K8S_VERSION, NS, ROOT, container, env, find, one, render, validate

EXAMPLES = ROOT / "examples" / "kubernetes"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as c:
        yield c


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def manifests() -> list[pathlib.Path]:
    return sorted(p for p in EXAMPLES.glob("*.yaml") if not p.name.startswith("values-"))


def values_files() -> list[pathlib.Path]:
    return sorted(EXAMPLES.glob("values-*.yaml"))


def test_the_examples_are_there() -> None:
    assert [p.name for p in manifests()] == ["agent-pod.yaml", "tokens-secret.yaml"]
    assert [p.name for p in values_files()] == [
        "values-cert-manager.yaml", "values-monitoring.yaml", "values-token-auth.yaml"]


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_example_manifests_are_valid(path: pathlib.Path) -> None:
    for doc in load(path.name):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", values_files(), ids=lambda p: p.name)
def test_example_values_render_valid_manifests(chart: helm_python.Chart,
                                               path: pathlib.Path) -> None:
    values = yaml.safe_load(path.read_text())
    chart.validate_schema(values)
    docs = render(chart, values)
    for doc in docs:
        validate(doc)
    if path.name == "values-monitoring.yaml":
        assert find(docs, "ServiceMonitor") and find(docs, "PrometheusRule")
        assert find(docs, "ConfigMap", "agenttx-dashboard")
    if path.name == "values-cert-manager.yaml":
        assert len(find(docs, "Certificate")) == 4  # service, etcd CA, member, client


def test_agent_pod_sends_the_token_the_service_expects(chart: helm_python.Chart) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in load("agent-pod.yaml")}
    pod = docs[("Pod", "billing-agent")]
    spec = pod["spec"]
    (agent,) = spec["containers"]
    (token_volume,) = [v for v in spec["volumes"] if "projected" in v]
    (source,) = token_volume["projected"]["sources"]
    assert source == {"serviceAccountToken": {"audience": "agenttx", "expirationSeconds": 3600,
                                              "path": "agenttx-token"}}
    rendered = render(chart)
    service = env(container(one(rendered, "Deployment", "agenttx"), "agenttx"))
    assert source["serviceAccountToken"]["audience"] == service["AGENTTX_AUTH_K8S_AUDIENCE"]
    (mount,) = [m for m in agent["volumeMounts"] if m["name"] == token_volume["name"]]
    e = env(agent)
    assert e["AGENTTX_TOKEN_FILE"] == f"{mount['mountPath']}/agenttx-token"
    svc = one(rendered, "Service", "agenttx")
    assert e["AGENTTX_TARGET"] == f"agenttx.{NS}.svc:{svc['spec']['ports'][0]['port']}"
    # The token is the pod's only credential: no default API token.
    account = docs[("ServiceAccount", "billing-agent")]
    assert spec["serviceAccountName"] == "billing-agent"
    assert account["automountServiceAccountToken"] is False
    # The script the pod runs sends it as `authorization: Bearer <token>` metadata.
    script = docs[("ConfigMap", "billing-agent")]["data"]["agent.py"]
    assert '("authorization", f"Bearer {token}")' in script
    assert agent["command"] == ["python", "/opt/agent/agent.py"]
    compile(script, "agent.py", "exec")


def test_agent_namespace_is_admitted_by_the_network_policy(chart: helm_python.Chart) -> None:
    (namespace,) = [d for d in load("agent-pod.yaml") if d["kind"] == "Namespace"]
    policy = one(render(chart), "NetworkPolicy", "agenttx")["spec"]
    grpc_rule = next(r for r in policy["ingress"] if r["ports"][0]["port"] == "grpc")
    (peer,) = grpc_rule["from"]
    wanted = peer["namespaceSelector"]["matchLabels"]
    assert wanted.items() <= namespace["metadata"]["labels"].items()


def test_tokens_secret_matches_the_token_values() -> None:
    (secret,) = load("tokens-secret.yaml")
    values = yaml.safe_load((EXAMPLES / "values-token-auth.yaml").read_text())
    assert values["auth"]["mode"] == "token"
    assert secret["metadata"] == {"name": values["auth"]["token"]["secretName"],
                                  "namespace": NS}
    text = secret["stringData"][values["auth"]["token"]["key"]]
    tokens = yaml.safe_load(text)["tokens"]
    assert [t["principal"] for t in tokens] == ["billing-agent", "oncall"]
    for entry in tokens:
        assert set(entry) == {"sha256", "principal", "namespace", "roles"}
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
    # The hashes are those of the example tokens the comments name.
    named = re.findall(r'example token "([^"]+)"', text)
    assert [hashlib.sha256(t.encode()).hexdigest() for t in named] == [
        t["sha256"] for t in tokens]
