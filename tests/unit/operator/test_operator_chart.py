"""The Helm chart, rendered offline with helm-python-sdk (Helm's Go SDK through ctypes: no
helm binary, no cluster, no network), every manifest validated against the Kubernetes
schemas with kubernetes-validate, and the rendered objects checked for what the chart
promises: probes, least-privilege RBAC, securityContext, replicas, etcd flags, CRD
gating, and no drift between the chart's CRD and crds/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
import yaml

from agenttx.config import DefaultPolicy
from support.chart import (
    CHART,
    EXTERNAL_TLS,
    NS,
    ROOT,
    VARIANTS,
    container,
    env,
    find,
    notes,
    one,
    render,
    validate,
)

CRD_FILES = ["agenttxpolicies.agenttx.io.yaml", "agenttxtoolsets.agenttx.io.yaml"]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as c:
        yield c


# ---- every manifest is valid Kubernetes ---------------------------------------------

@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_manifest_is_valid(chart: helm_python.Chart, variant: str) -> None:
    docs = render(chart, VARIANTS[variant])
    assert docs
    for doc in docs:
        validate(doc)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "agenttx"


def test_chart_lints_clean() -> None:
    report = helm_python.lint(CHART, strict=True, namespace=NS)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


# ---- the service -------------------------------------------------------------------

def test_service_deployment_defaults(chart: helm_python.Chart) -> None:
    docs = render(chart)
    dep = one(docs, "Deployment", "agenttx")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    c = container(dep, "agenttx")
    assert c["args"] == ["serve", "--listen", "0.0.0.0:50051",
                         "--metrics-listen", "0.0.0.0:9090"]
    # Readiness asks the health service (NOT_SERVING without etcd); liveness and startup
    # only the port, so a replica cut off from etcd leaves the Service but is not killed.
    assert c["readinessProbe"]["grpc"] == {"port": 50051}
    for probe in ("livenessProbe", "startupProbe"):
        assert c[probe]["tcpSocket"] == {"port": "grpc"}, probe
        assert "grpc" not in c[probe] and "exec" not in c[probe], probe
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/tmp"] == "tmp" and mounts["/var/lib/agenttx/data"] == "data"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"] and "emptyDir" in volumes["data"]
    e = env(c)
    assert e["AGENTTX_ETCD_ENDPOINTS"] == f"agenttx-etcd.{NS}.svc:2379"
    assert e["AGENTTX_ETCD_PREFIX"] == "/agenttx"
    assert e["AGENTTX_FS_ROOT"] == "/var/lib/agenttx/fs"
    assert e["AGENTTX_DATA_DIR"] == "/var/lib/agenttx/data"
    assert e["AGENTTX_TX_IDLE_TIMEOUT_S"] == "900"
    assert e["AGENTTX_DEFAULT_POLICY__MAX_LOCAL_DEPTH"] == "3"
    assert e["AGENTTX_DEFAULT_POLICY__MAX_GLOBAL_RESETS"] == "1"
    assert float(e["AGENTTX_DEFAULT_POLICY__REPLAY_BUDGET_FACTOR"]) == 2.0
    assert e["AGENTTX_EFFECT_CHANNELS"] == "{}"
    assert e["AGENTTX_LOG_FORMAT"] == "json"
    assert e["AGENTTX_LOG_LEVEL"] == "INFO"
    assert e["AGENTTX_ETCD_MAX_TXN_OPS"] == "1024"  # the bundled etcd's --max-txn-ops
    assert e["AGENTTX_GRACE_PERIOD_S"] == "25"  # drains before the kubelet's SIGKILL
    # The bundled etcd speaks mutual TLS: the client certificate of the chart's own CA.
    assert e["AGENTTX_ETCD_CA_FILE"] == "/etc/agenttx/etcd-tls/ca.crt"
    assert e["AGENTTX_ETCD_CERT_FILE"] == "/etc/agenttx/etcd-tls/tls.crt"
    assert e["AGENTTX_ETCD_KEY_FILE"] == "/etc/agenttx/etcd-tls/tls.key"
    assert volumes["etcd-tls"]["secret"]["secretName"] == "agenttx-etcd-client-tls"


def test_service_replicas_and_pdb(chart: helm_python.Chart) -> None:
    docs = render(chart, {"service": {"replicas": 3}})
    assert one(docs, "Deployment", "agenttx")["spec"]["replicas"] == 3
    pdb = one(docs, "PodDisruptionBudget", "agenttx")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "service"
    single = render(chart, {"service": {"replicas": 1}})
    assert find(single, "PodDisruptionBudget", "agenttx") == []  # would block every drain


def test_service_exposes_grpc(chart: helm_python.Chart) -> None:
    svc = one(render(chart), "Service", "agenttx")
    assert svc["spec"]["ports"] == [{"name": "grpc", "port": 50051, "targetPort": "grpc",
                                     "protocol": "TCP", "appProtocol": "grpc"}]
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "service"


def test_effect_channels_and_default_policy_reach_the_env(chart: helm_python.Chart) -> None:
    docs = render(chart, {"service": {
        "effectChannels": {"audit": {"kind": "webhook", "url": "http://hook"}},
        "defaultPolicy": {"maxLocalDepth": 0, "replayBudgetFactor": 1.5},
        "fsRoot": {"existingClaim": "shared-fs"},
    }})
    dep = one(docs, "Deployment", "agenttx")
    e = env(container(dep, "agenttx"))
    assert yaml.safe_load(e["AGENTTX_EFFECT_CHANNELS"]) == {
        "audit": {"kind": "webhook", "url": "http://hook"}}
    assert e["AGENTTX_DEFAULT_POLICY__MAX_LOCAL_DEPTH"] == "0"
    assert e["AGENTTX_DEFAULT_POLICY__REPLAY_BUDGET_FACTOR"] == "1.5"
    # nothing needs approval unless the platform team says so; the JSON is the setting's
    assert json.loads(e["AGENTTX_DEFAULT_POLICY__APPROVAL"]) == {
        "required": [], "approvers": [], "timeoutSeconds": 86400, "notifyChannel": ""}
    approval = {"required": [{"channel": "payments"}, {"tool": "tickets.*"}],
                "approvers": [], "timeoutSeconds": 3600, "notifyChannel": "ops"}
    docs = render(chart, {"service": {"defaultPolicy": {"approval": approval}}})
    e = env(container(one(docs, "Deployment", "agenttx"), "agenttx"))
    assert json.loads(e["AGENTTX_DEFAULT_POLICY__APPROVAL"]) == approval
    # ...and the service reads it as the setting it is
    setting = DefaultPolicy(approval=e["AGENTTX_DEFAULT_POLICY__APPROVAL"])
    assert setting.approval_settings().timeout_s == 3600
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["fs-root"] == {"name": "fs-root",
                                  "persistentVolumeClaim": {"claimName": "shared-fs"}}


# ---- RBAC --------------------------------------------------------------------------

EXPECTED_POLICY_RULES = [
    {"apiGroups": ["agenttx.io"], "resources": ["agenttxpolicies"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["agenttx.io"], "resources": ["agenttxpolicies/status"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["agenttx.io"], "resources": ["agenttxpolicies/finalizers"],
     "verbs": ["update"]},
    {"apiGroups": ["agenttx.io"], "resources": ["agenttxtoolsets"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["agenttx.io"], "resources": ["agenttxtoolsets/status"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["agenttx.io"], "resources": ["agenttxtoolsets/finalizers"],
     "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # The Secrets toolsets' headers name: read by name only.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
]
EXPECTED_SANDBOX_RULES = [
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"],
     "verbs": ["get", "create", "patch", "delete"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["agenttx"],
     "verbs": ["get", "patch"]},
]
# The operator's copies of toolsets' header Secrets, in the release namespace only.
EXPECTED_TOOLSET_RULES = [
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch", "delete"]},
]


ISSUER_DISCOVERY = f"{NS}-agenttx-operator-issuer-discovery"


def _bound_subjects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
            for s in d["subjects"]]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_service_account_of_the_service_has_no_api_rights(chart: helm_python.Chart,
                                                          variant: str) -> None:
    docs = render(chart, VARIANTS[variant])
    sa = one(docs, "ServiceAccount", "agenttx")
    assert sa["automountServiceAccountToken"] is False
    assert [s for s in _bound_subjects(docs) if s["name"] == "agenttx"] == []
    dep = one(docs, "Deployment", "agenttx")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "agenttx"


def test_operator_rbac_is_exactly_what_it_needs(chart: helm_python.Chart) -> None:
    docs = render(chart)
    assert {s["name"] for s in _bound_subjects(docs)} == {"agenttx-operator"}
    cluster_role = one(docs, "ClusterRole", f"{NS}-agenttx-operator")
    assert cluster_role["rules"] == EXPECTED_POLICY_RULES
    crb = one(docs, "ClusterRoleBinding", f"{NS}-agenttx-operator")
    assert crb["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert {r["metadata"]["name"] for r in find(docs, "ClusterRole")} == {
        f"{NS}-agenttx-operator", ISSUER_DISCOVERY}
    roles = {r["metadata"]["name"]: r for r in find(docs, "Role")}
    assert sorted(roles) == ["agenttx-operator-sandboxes", "agenttx-operator-toolsets"]
    assert {r["metadata"]["namespace"] for r in roles.values()} == {NS}
    assert roles["agenttx-operator-sandboxes"]["rules"] == EXPECTED_SANDBOX_RULES
    assert roles["agenttx-operator-toolsets"]["rules"] == EXPECTED_TOOLSET_RULES
    bindings = {rb["roleRef"]["name"]: rb for rb in find(docs, "RoleBinding")}
    assert sorted(bindings) == sorted(roles)
    for name, rb in bindings.items():
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": name}
    # No wildcard anywhere, no peering, no CRD or namespace scanning; Secrets only in the
    # two rules above (never listed or watched).
    rbac = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    text = yaml.safe_dump(rbac)
    for forbidden in ("'*'", "kopfpeerings", "customresourcedefinitions", "namespaces"):
        assert forbidden not in text, forbidden
    secret_rules = [r for d in rbac for r in d["rules"] if "secrets" in r.get("resources", [])]
    assert secret_rules == [EXPECTED_POLICY_RULES[-1], EXPECTED_TOOLSET_RULES[0]]


def test_operator_rbac_narrows_to_watched_namespaces(chart: helm_python.Chart) -> None:
    docs = render(chart, VARIANTS["namespaced-operator"])
    # Only the issuer-discovery URLs stay cluster-wide (they exist only as ClusterRole rules).
    assert [r["metadata"]["name"] for r in find(docs, "ClusterRole")] == [ISSUER_DISCOVERY]
    assert [r["metadata"]["name"] for r in find(docs, "ClusterRoleBinding")] == [ISSUER_DISCOVERY]
    policy_roles = [r for r in find(docs, "Role") if r["rules"] == EXPECTED_POLICY_RULES]
    assert sorted(r["metadata"]["namespace"] for r in policy_roles) == ["team-a", "team-b"]
    dep = one(docs, "Deployment", "agenttx-operator")
    assert env(container(dep, "operator"))["AGENTTX_OPERATOR_NAMESPACES"] == "team-a,team-b"


# ---- the operator ------------------------------------------------------------------

def test_operator_deployment(chart: helm_python.Chart) -> None:
    dep = one(render(chart), "Deployment", "agenttx-operator")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "agenttx-operator"
    c = container(dep, "operator")
    assert c["args"] == ["operator"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"healthz": 8080}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    e = env(c)
    assert e == {
        "AGENTTX_OPERATOR_ETCD_ENDPOINTS": f"agenttx-etcd.{NS}.svc:2379",
        "AGENTTX_OPERATOR_ETCD_PREFIX": "/agenttx",
        "AGENTTX_OPERATOR_SERVICE_NAMESPACE": NS,
        "AGENTTX_OPERATOR_SERVICE_DEPLOYMENT": "agenttx",
        "AGENTTX_OPERATOR_SERVICE_CONTAINER": "agenttx",
        "AGENTTX_OPERATOR_SANDBOX_MOUNT_ROOT": "/sandboxes",
        "AGENTTX_OPERATOR_NAMESPACES": "",
        "AGENTTX_OPERATOR_LIVENESS_PORT": "8080",
        "AGENTTX_OPERATOR_SWEEP_INTERVAL_S": "300",
        "AGENTTX_OPERATOR_TOOLSET_RESYNC_S": "60",
        "AGENTTX_OPERATOR_LOG_FORMAT": "json",
        "AGENTTX_OPERATOR_JWKS_PUBLISH": "true",
        "AGENTTX_OPERATOR_JWKS_REFRESH_S": "300",
        "AGENTTX_OPERATOR_ETCD_CA_FILE": "/etc/agenttx/etcd-tls/ca.crt",
        "AGENTTX_OPERATOR_ETCD_CERT_FILE": "/etc/agenttx/etcd-tls/tls.crt",
        "AGENTTX_OPERATOR_ETCD_KEY_FILE": "/etc/agenttx/etcd-tls/tls.key",
    }


def test_operator_env_matches_its_settings() -> None:
    """Every AGENTTX_OPERATOR_* the chart sets is a field of OperatorConfig."""
    from agenttx_operator.config import OperatorConfig

    text = (CHART / "templates" / "operator-deployment.yaml").read_text()
    text += (CHART / "templates" / "_helpers.tpl").read_text()
    names = set(re.findall(r"AGENTTX_OPERATOR_([A-Z_]+)", text))
    names |= {f"{n}_FILE" for n in ("ETCD_CA", "ETCD_CERT", "ETCD_KEY")}
    names -= {"ETCD_CA", "ETCD_CERT", "ETCD_KEY", ""}
    fields = {f.upper() for f in OperatorConfig.model_fields}
    assert names - fields == set(), names - fields


def test_service_env_matches_its_settings(chart: helm_python.Chart) -> None:
    """Every AGENTTX_* the chart gives the service is a field of agenttx.config.Settings."""
    from agenttx.config import Settings

    docs = render(chart, EXTERNAL_TLS)
    names = set(env(container(one(docs, "Deployment", "agenttx"), "agenttx")))
    fields = {f.upper() for f in Settings.model_fields}
    for name in names:
        field = name.removeprefix("AGENTTX_").split("__")[0]
        assert field in fields, name


def test_service_and_operator_share_the_image(chart: helm_python.Chart) -> None:
    docs = render(chart, {"image": {"repository": "reg/agenttx", "tag": "1.2.3",
                                    "pullPolicy": "Never"}})
    for name, cname in (("agenttx", "agenttx"), ("agenttx-operator", "operator")):
        c = container(one(docs, "Deployment", name), cname)
        assert (c["image"], c["imagePullPolicy"]) == ("reg/agenttx:1.2.3", "Never")
    default = container(one(render(chart), "Deployment", "agenttx"), "agenttx")
    assert default["image"].endswith(":0.1.0")  # appVersion


def test_operator_can_be_disabled(chart: helm_python.Chart) -> None:
    docs = render(chart, {"operator": {"enabled": False}})
    assert find(docs, "Deployment", "agenttx-operator") == []
    assert find(docs, "ClusterRole") == [] and find(docs, "Role") == []


# ---- etcd --------------------------------------------------------------------------

def test_bundled_etcd_statefulset(chart: helm_python.Chart) -> None:
    docs = render(chart)
    sts = one(docs, "StatefulSet", "agenttx-etcd")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "agenttx-etcd-peer"
    args = container(sts, "etcd")["args"]
    assert "--max-request-bytes=16777216" in args
    assert "--max-txn-ops=1024" in args
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count("=https://") == 3
    assert f"agenttx-etcd-2=https://agenttx-etcd-2.agenttx-etcd-peer.{NS}.svc:2380" in cluster
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"] == {
        "storage": "2Gi"}
    peer = one(docs, "Service", "agenttx-etcd-peer")
    assert peer["spec"]["clusterIP"] == "None"
    assert peer["spec"]["publishNotReadyAddresses"] is True
    assert one(docs, "Service", "agenttx-etcd")["spec"]["ports"][0]["port"] == 2379
    assert one(docs, "PodDisruptionBudget", "agenttx-etcd")["spec"]["maxUnavailable"] == 1


def test_external_etcd_with_tls(chart: helm_python.Chart) -> None:
    docs = render(chart, EXTERNAL_TLS)
    assert find(docs, "StatefulSet") == []
    assert sorted(s["metadata"]["name"] for s in find(docs, "Service")) == [
        "agenttx", "agenttx-metrics"]
    assert find(docs, "Secret") == []  # no etcd certificates of the chart's own
    for name, cname, prefix in (("agenttx", "agenttx", "AGENTTX_"),
                                ("agenttx-operator", "operator", "AGENTTX_OPERATOR_")):
        dep = one(docs, "Deployment", name)
        c = container(dep, cname)
        e = env(c)
        assert e[f"{prefix}ETCD_ENDPOINTS"] == "etcd-a.db:2379,etcd-b.db:2379"
        if prefix == "AGENTTX_":
            assert e["AGENTTX_ETCD_MAX_TXN_OPS"] == "128"  # etcd's default, not ours
        assert e[f"{prefix}ETCD_CA_FILE"] == "/etc/agenttx/etcd-tls/ca.crt"
        assert e[f"{prefix}ETCD_CERT_FILE"] == "/etc/agenttx/etcd-tls/tls.crt"
        assert e[f"{prefix}ETCD_KEY_FILE"] == "/etc/agenttx/etcd-tls/tls.key"
        assert {"name": "etcd-tls", "mountPath": "/etc/agenttx/etcd-tls",
                "readOnly": True} in c["volumeMounts"]
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        assert volumes["etcd-tls"]["secret"]["secretName"] == "etcd-client"


def test_external_etcd_needs_endpoints(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmError, match="etcd.external.endpoints"):
        render(chart, {"etcd": {"enabled": False}})


# ---- CRDs --------------------------------------------------------------------------

def test_chart_crd_copies_do_not_drift_from_crds() -> None:
    assert sorted(p.name for p in (ROOT / "crds").glob("*.yaml")) == CRD_FILES
    assert sorted(p.name for p in (CHART / "files" / "crds").glob("*.yaml")) == CRD_FILES
    for name in CRD_FILES:
        assert (CHART / "files" / "crds" / name).read_bytes() == \
            (ROOT / "crds" / name).read_bytes(), (
            f"charts/agenttx/files/crds/{name} differs from crds/: run `make chart-crds`")


def test_make_chart_crds_copies_every_crd_and_tilt_applies_every_crd() -> None:
    recipe = (ROOT / "Makefile").read_text().split("chart-crds:\n", 1)[1].split("\n\n")[0]
    tiltfile = (ROOT / "Tiltfile").read_text()
    for name in CRD_FILES:
        assert f"crds/{name}" in recipe, name
        assert f"'crds/{name}'" in tiltfile, name  # the operator needs both to start


def test_rendered_crds_equal_the_sources_plus_release_metadata(
        chart: helm_python.Chart) -> None:
    crds = {c["metadata"]["name"]: c for c in find(render(chart), "CustomResourceDefinition")}
    assert sorted(crds) == ["agenttxpolicies.agenttx.io", "agenttxtoolsets.agenttx.io"]
    for name in CRD_FILES:
        source = yaml.safe_load((ROOT / "crds" / name).read_text())
        crd = crds[source["metadata"]["name"]]
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == "agenttx"
        strip = {k: v for k, v in crd["metadata"].items() if k not in ("labels", "annotations")}
        assert strip == {k: v for k, v in source["metadata"].items() if k != "labels"}
        assert crd["spec"] == source["spec"]


def test_notes_name_every_crd_to_install_when_the_chart_does_not(
        chart: helm_python.Chart) -> None:
    text = notes(chart, {"crds": {"enabled": False}})
    for name in CRD_FILES:
        assert f"crds/{name}" in text, name
    assert "crds/" not in notes(chart)


def test_crds_are_gated(chart: helm_python.Chart) -> None:
    assert find(render(chart, {"crds": {"enabled": False}}), "CustomResourceDefinition") == []
    crds = find(render(chart, {"crds": {"keep": False}}), "CustomResourceDefinition")
    assert len(crds) == 2
    for crd in crds:
        assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
    # Helm's own crds/ folder would bypass the gate: the chart must not have one.
    assert not (CHART / "crds").exists()


# ---- values ------------------------------------------------------------------------

@pytest.mark.parametrize("values", [
    {"service": {"defaultPolicy": {"maxLocalDepth": 17}}},
    {"service": {"defaultPolicy": {"approval": {"required": [{"tool": "a", "channel": "b"}]}}}},
    {"service": {"defaultPolicy": {"approval": {"timeoutSeconds": 1}}}},
    {"service": {"replicas": 0}},
    {"etcd": {"replicas": 2}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"servce": {"replicas": 2}},
    {"etcd": {"external": {"endpoints": ["no-port"]}}},
])
def test_values_schema_rejects_bad_values(chart: helm_python.Chart,
                                          values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError):
        chart.validate_schema(values)


def test_default_values_pass_the_schema(chart: helm_python.Chart) -> None:
    chart.validate_schema({})
    for values in VARIANTS.values():
        chart.validate_schema(values)


def test_every_value_is_commented() -> None:
    """Each key in values.yaml has a comment right above it, except inside a value
    documented as a whole (a comment block starting with `# -- ` above a map, e.g.
    `resources`)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented: list[str] = []
    exempt_indent: int | None = None
    previous = ""
    block_start = ""  # first line of the comment block right above, if any
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            previous = block_start = ""
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            if not previous.startswith("#"):
                block_start = stripped
            previous = stripped
            continue
        key = re.match(r"^\s*([A-Za-z][\w./-]*):", line)
        if key:
            if exempt_indent is not None and indent > exempt_indent:
                previous = block_start = stripped
                continue
            exempt_indent = None
            if not previous.startswith("#"):
                undocumented.append(f"{number}: {key.group(1)}")
            elif block_start.startswith("# --"):
                exempt_indent = indent
        previous = block_start = stripped
    assert undocumented == []


def test_every_value_is_in_the_schema() -> None:
    """Each key of values.yaml is declared in values.schema.json, down to where the schema
    deliberately takes a free-form map (resources, labels, selectors, ...)."""

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    undeclared: list[str] = []

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if not isinstance(value, dict) or "properties" not in node:
            return
        for key, sub in value.items():
            if key not in node["properties"]:
                undeclared.append(f"{path}{key}")
            else:
                walk(sub, node["properties"][key], f"{path}{key}.")

    walk(values, schema, "")
    assert undeclared == []
