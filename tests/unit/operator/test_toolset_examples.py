"""examples/toolsets/: the files `kubectl apply -f examples/toolsets/` applies fit together
(the toolsets reach the upstream Service's ports and name the Secret key it has), every
Kubernetes object in them is valid, and the ConfigMap carries exactly
examples/toolsets/upstream/server.py (which tests/integration/operator/
test_toolset_example_upstream.py runs)."""

from __future__ import annotations

import pathlib
import urllib.parse
from typing import Any

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "toolsets"
NAMESPACE = "team-a"  # what the examples and docs/kubernetes.md apply them to


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def test_apply_dir_holds_the_upstream_its_secret_and_two_toolsets() -> None:
    kinds = sorted(d["kind"] for p in sorted(EXAMPLES.glob("*.yaml")) for d in docs(p.name))
    assert kinds == ["AgentTxToolset", "AgentTxToolset", "ConfigMap", "Deployment", "Secret",
                     "Service"]
    for path in EXAMPLES.glob("*.yaml"):
        assert path.read_text().startswith("# "), f"{path.name} must say what it is for"


def test_the_configmap_carries_the_upstream_script_unchanged() -> None:
    config = docs("upstream.yaml")[0]
    assert config["kind"] == "ConfigMap"
    assert config["data"]["server.py"] == (EXAMPLES / "upstream" / "server.py").read_text()


def test_built_in_objects_are_valid_kubernetes() -> None:
    for name in ("upstream.yaml", "secret.yaml"):
        for doc in docs(name):
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_toolsets_point_at_the_upstream_service_and_the_secret_key() -> None:
    service = docs("upstream.yaml")[2]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    secret = docs("secret.yaml")[0]
    for name, port in (("tickets.yaml", ports["tickets"]), ("mail.yaml", ports["mail"])):
        (toolset,) = docs(name)
        url = urllib.parse.urlsplit(toolset["spec"]["upstream"]["url"])
        # Namespace-qualified: the operator and the service resolve it from their own.
        assert (url.hostname, url.port, url.path) == (
            f"{service['metadata']['name']}.{NAMESPACE}.svc", port, "/mcp")
    (header,) = docs("tickets.yaml")[0]["spec"]["upstream"]["headers"]
    assert header["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "header"}
    assert "header" in secret["stringData"]
    # The upstream checks the same key the toolset sends.
    (upstream,) = docs("upstream.yaml")[1]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in upstream["env"]}
    assert env["TICKETS_AUTHORIZATION"]["valueFrom"]["secretKeyRef"] == header["secretKeyRef"]
