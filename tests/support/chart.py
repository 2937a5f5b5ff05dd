"""Render the Helm chart offline and validate what it produces, for the chart tests.

Why one module: the chart's tests (tests/unit/operator/test_operator_chart.py,
tests/unit/test_chart_*.py, tests/integration/test_chart_*.py) all render the same chart
the same way (helm-python-sdk: Helm's Go SDK through ctypes, no helm binary, no cluster)
and must judge a manifest by the same rules. Built-in kinds are checked by
kubernetes-validate in strict mode; custom resources (cert-manager, prometheus-operator)
against the upstream CRD schemas in tests/unit/chart_crd_schemas/, with unknown fields
rejected as the API server's strict field validation does. It never talks to a cluster.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import pathlib
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agenttx"
CRD_SCHEMAS = ROOT / "tests" / "unit" / "chart_crd_schemas"
NS = "agenttx-system"
K8S_VERSION = "1.30.0"

Doc = dict[str, Any]


def render(chart: helm_python.Chart, values: dict[str, Any] | None = None,
           release: str = "agenttx") -> list[Doc]:
    out = chart.render(values or {}, name=release, namespace=NS, is_install=True)
    docs: list[Doc] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def notes(chart: helm_python.Chart, values: dict[str, Any] | None = None) -> str:
    out = chart.render(values or {}, name="agenttx", namespace=NS, is_install=True)
    (text,) = [t for p, t in out.items() if p.endswith("NOTES.txt")]
    return text


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind
            and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = find(docs, kind, name)
    return found


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Doc, name: str) -> Doc:
    (c,) = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    return c


def env(c: Doc) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def volumes(workload: Doc) -> dict[str, Doc]:
    return {v["name"]: v for v in pod_spec(workload).get("volumes", [])}


def mounts(c: Doc) -> dict[str, Doc]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


def secret_data(secret: Doc) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


# ---- validation ---------------------------------------------------------------------

def _strict(schema: Any) -> Any:
    """An openAPIV3Schema where objects reject fields they do not declare (what the API
    server's strict field validation does), unless the schema preserves unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _custom_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    validators = {}
    for path in sorted(CRD_SCHEMAS.glob("*.json")):
        doc = json.loads(path.read_text())
        schema = _strict(copy.deepcopy(doc["openAPIV3Schema"]))
        # metadata is validated as ObjectMeta below, not by the CRD.
        schema["properties"]["metadata"] = {"type": "object"}
        validators[(f"{doc['group']}/{doc['version']}", doc["kind"])] = (
            jsonschema.Draft7Validator(schema))
    return validators


def validate(doc: Doc) -> None:
    """Raise if the manifest would not pass the API server (built-in or known CRD kind)."""
    key = (doc["apiVersion"], doc["kind"])
    validators = _custom_validators()
    if key in validators:
        errors = sorted(validators[key].iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: " + "; ".join(
                f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors))
        # The metadata must be a valid ObjectMeta: check it inside a ConfigMap.
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": doc["metadata"]}, K8S_VERSION, strict=True)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def custom_kinds() -> set[tuple[str, str]]:
    return set(_custom_validators())


# ---- the variants every structural test runs over -----------------------------------

EXTERNAL_TLS: dict[str, Any] = {
    "etcd": {"enabled": False, "external": {
        "endpoints": ["etcd-a.db:2379", "etcd-b.db:2379"],
        "tls": {"enabled": True, "secretName": "etcd-client"}}},
}
TLS_SECRET_MTLS: dict[str, Any] = {"tls": {"secretName": "agenttx-serving", "clientAuth": True}}
CERT_MANAGER: dict[str, Any] = {
    "tls": {"certManager": {"enabled": True,
                            "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}},
    "etcd": {"tls": {"certManager": {"enabled": True}}},
}
MONITORING: dict[str, Any] = {"metrics": {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
    "dashboard": {"enabled": True}}}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "external-etcd-tls": EXTERNAL_TLS,
    "crds-disabled": {"crds": {"enabled": False}},
    "replicas-3": {"service": {"replicas": 3}},
    "namespaced-operator": {"operator": {"watchNamespaces": ["team-a", "team-b"]}},
    "single-etcd-no-persistence": {"etcd": {"replicas": 1, "persistence": {"enabled": False}},
                                   "service": {"replicas": 1}},
    "auth-token": {"auth": {"mode": "token", "token": {"secretName": "agenttx-tokens"}}},
    "auth-mtls": {"auth": {"mode": "mtls"}, **TLS_SECRET_MTLS},
    "auth-none": {"auth": {"mode": "none", "allowUnauthenticated": True}},
    "tls-secret": {"tls": {"secretName": "agenttx-serving"}},
    "cert-manager": CERT_MANAGER,
    "cert-manager-etcd-own-issuer": {"etcd": {"tls": {"certManager": {
        "enabled": True, "issuerRef": {"name": "etcd-ca", "kind": "ClusterIssuer"}}}}},
    "etcd-plaintext": {"etcd": {"tls": {"enabled": False}}},
    "monitoring": MONITORING,
    "metrics-off": {"metrics": {"enabled": False}},
    "network-policy-off": {"networkPolicy": {"enabled": False}},
    "operator-disabled": {"operator": {"enabled": False}},
    "console": {"console": {"enabled": True}},
    "console-https-service-tls": {"console": {"enabled": True,
                                              "tls": {"secretName": "console-https"}},
                                  "tls": {"secretName": "agenttx-serving"}},
}
