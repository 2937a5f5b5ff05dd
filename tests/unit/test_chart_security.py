"""What the chart promises for security (SPEC §9, last bullet), on the rendered manifests.

Rendered offline (helm-python-sdk), in every variant of support.chart.VARIANTS: who may
reach etcd and the service (NetworkPolicies, checked against the labels of the pods they
must and must not select), the hardened securityContext of every container, etcd's TLS
flags and certificates (the generated certificates are parsed and verified), the
service's and operator's etcd client certificate mounts, the auth mode as the service's
own Settings read it, client TLS from a Secret or cert-manager, and the operator's RBAC
for the service-account issuer discovery.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import helm_python
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.chart import (
    CERT_MANAGER,
    CHART,
    NS,
    TLS_SECRET_MTLS,
    VARIANTS,
    Doc,
    container,
    env,
    find,
    mounts,
    one,
    pod_spec,
    render,
    secret_data,
    volumes,
)


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as c:
        yield c


WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod")


def pod_templates(docs: list[Doc]) -> list[tuple[str, Doc, Doc]]:
    """(name, pod template metadata, pod spec) of every workload in the render."""
    out = []
    for d in docs:
        if d["kind"] not in WORKLOADS:
            continue
        if d["kind"] == "Pod":
            out.append((d["metadata"]["name"], d["metadata"], d["spec"]))
        elif d["kind"] == "CronJob":
            t = d["spec"]["jobTemplate"]["spec"]["template"]
            out.append((d["metadata"]["name"], t["metadata"], t["spec"]))
        else:
            t = d["spec"]["template"]
            out.append((d["metadata"]["name"], t["metadata"], t["spec"]))
    return out


def service_settings(dep: Doc, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The service's Settings exactly as `agenttx serve` builds them from this container's
    args and env (the downward-API namespace filled in as the kubelet would)."""
    from agenttx.commands import serve_settings

    c = container(dep, "agenttx")
    for e in c["env"]:
        if "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
        else:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, e
            monkeypatch.setenv(e["name"], NS)
    assert c["args"][0] == "serve", c["args"]
    return serve_settings(c["args"][1:])


# ---- NetworkPolicies ------------------------------------------------------------------

def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the chart uses matchLabels only
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def pod_labels(docs: list[Doc]) -> dict[str, dict[str, str]]:
    return {name: meta["labels"] for name, meta, _ in pod_templates(docs)}


def policy(docs: list[Doc], name: str) -> Doc:
    return one(docs, "NetworkPolicy", name)["spec"]


def rule_for(spec: Doc, port: str | int) -> Doc:
    (rule,) = [r for r in spec["ingress"] if any(p["port"] == port for p in r["ports"])]
    return rule


def test_network_policies_select_exactly_their_pods(chart: helm_python.Chart) -> None:
    docs = render(chart)
    labels = pod_labels(docs)
    expected = {"agenttx-etcd": {"agenttx-etcd"}, "agenttx": {"agenttx"},
                "agenttx-operator": {"agenttx-operator"}}
    assert {p["metadata"]["name"] for p in find(docs, "NetworkPolicy")} == set(expected)
    for name, workloads in expected.items():
        spec = policy(docs, name)
        assert {w for w, lab in labels.items() if selects(spec["podSelector"], lab)} == workloads
        # Another release in the same namespace is not selected.
        other = dict(labels[next(iter(workloads))], **{"app.kubernetes.io/instance": "other"})
        assert not selects(spec["podSelector"], other)


def test_etcd_accepts_clients_only_from_service_and_operator(chart: helm_python.Chart) -> None:
    docs = render(chart)
    labels = pod_labels(docs)
    spec = policy(docs, "agenttx-etcd")
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert len(spec["ingress"]) == 3

    client = rule_for(spec, "client")
    assert client["ports"] == [{"port": "client", "protocol": "TCP"}]
    assert all(set(peer) == {"podSelector"} for peer in client["from"])  # same namespace only
    allowed = {w for w, lab in labels.items()
               if any(selects(p["podSelector"], lab) for p in client["from"])}
    assert allowed == {"agenttx", "agenttx-operator"}

    peer = rule_for(spec, "peer")
    assert peer["ports"] == [{"port": "peer", "protocol": "TCP"}]
    assert {w for w, lab in labels.items()
            if any(selects(p["podSelector"], lab) for p in peer["from"])} == {"agenttx-etcd"}

    metrics = rule_for(spec, "metrics")
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}, "podSelector": {}}]

    # Out: the other members' peer port and DNS, nothing else.
    assert spec["egress"][0]["ports"] == [{"port": 2380, "protocol": "TCP"}]
    assert {w for w, lab in labels.items()
            if selects(spec["egress"][0]["to"][0]["podSelector"], lab)} == {"agenttx-etcd"}
    assert spec["egress"][1] == {"ports": [{"port": 53, "protocol": "UDP"},
                                           {"port": 53, "protocol": "TCP"}]}
    # The named ports exist on the etcd container.
    etcd_ports = {p["name"]: p["containerPort"]
                  for p in container(one(docs, "StatefulSet", "agenttx-etcd"), "etcd")["ports"]}
    assert etcd_ports == {"client": 2379, "peer": 2380, "metrics": 2381}


def test_etcd_without_operator_accepts_only_the_service(chart: helm_python.Chart) -> None:
    docs = render(chart, VARIANTS["operator-disabled"])
    labels = pod_labels(docs)
    client = rule_for(policy(docs, "agenttx-etcd"), "client")
    assert {w for w, lab in labels.items()
            if any(selects(p["podSelector"], lab) for p in client["from"])} == {"agenttx"}
    assert find(docs, "NetworkPolicy", "agenttx-operator") == []


def test_service_accepts_grpc_only_from_labelled_namespaces(chart: helm_python.Chart) -> None:
    docs = render(chart)
    spec = policy(docs, "agenttx")
    assert spec["policyTypes"] == ["Ingress"]  # egress open: webhooks and SMTP anywhere
    grpc_rule = rule_for(spec, "grpc")
    assert grpc_rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "agenttx.io/client": "true"}}}]
    assert rule_for(spec, "metrics")["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}, "podSelector": {}}]
    ports = {p["name"] for p in container(one(docs, "Deployment", "agenttx"), "agenttx")["ports"]}
    assert ports == {"grpc", "metrics"}


def test_network_policy_peers_are_configurable(chart: helm_python.Chart) -> None:
    ingress = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}},
               "podSelector": {"matchLabels": {"app": "proxy"}}}
    # Helm merges maps with the defaults: a default label is dropped by setting it to null.
    docs = render(chart, {"networkPolicy": {
        "clientNamespaceLabel": {"team": "agents", "agenttx.io/client": None},
        "extraClientPeers": [ingress],
        "metricsNamespaceSelector": {"matchLabels": {
            "name": "obs", "kubernetes.io/metadata.name": None}},
        "metricsPodSelector": {"matchLabels": {"app": "prometheus"}}}})
    spec = policy(docs, "agenttx")
    assert rule_for(spec, "grpc")["from"] == [
        {"namespaceSelector": {"matchLabels": {"team": "agents"}}}, ingress]
    scrape = [{"namespaceSelector": {"matchLabels": {"name": "obs"}},
               "podSelector": {"matchLabels": {"app": "prometheus"}}}]
    assert rule_for(spec, "metrics")["from"] == scrape
    assert rule_for(policy(docs, "agenttx-etcd"), "metrics")["from"] == scrape


def test_operator_accepts_no_ingress(chart: helm_python.Chart) -> None:
    spec = policy(render(chart), "agenttx-operator")
    assert spec["policyTypes"] == ["Ingress"] and spec["ingress"] == []


def test_network_policies_can_be_disabled(chart: helm_python.Chart) -> None:
    assert find(render(chart, VARIANTS["network-policy-off"]), "NetworkPolicy") == []


def test_metrics_rules_follow_metrics_enabled(chart: helm_python.Chart) -> None:
    spec = policy(render(chart, VARIANTS["metrics-off"]), "agenttx")
    assert [p["port"] for r in spec["ingress"] for p in r["ports"]] == ["grpc"]


# ---- securityContext -------------------------------------------------------------------

@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_pod_and_container_is_hardened(chart: helm_python.Chart, variant: str) -> None:
    templates = pod_templates(render(chart, VARIANTS[variant]))
    assert templates
    for name, _meta, spec in templates:
        pod_sc = spec.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, name
        assert pod_sc.get("seccompProfile") == {"type": "RuntimeDefault"}, name
        assert "hostNetwork" not in spec and "hostPID" not in spec and "hostIPC" not in spec
        for c in spec["containers"] + spec.get("initContainers", []):
            where = f"{name}/{c['name']}"
            sc = c["securityContext"]
            assert sc.get("runAsNonRoot", True) is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc.get("privileged", False) is False, where
            assert sc.get("seccompProfile", {"type": "RuntimeDefault"}) == {
                "type": "RuntimeDefault"}, where
            # Secrets are mounted as directories: a subPath mount would freeze the file
            # and a rotated certificate or tokens file would never reach the process.
            assert all("subPath" not in m and "subPathExpr" not in m
                       for m in c.get("volumeMounts", [])), where
            for m in c.get("volumeMounts", []):
                v = {v["name"]: v for v in spec.get("volumes", [])}.get(m["name"])
                if v and ("secret" in v or "configMap" in v):
                    assert m.get("readOnly") is True, (where, m)


def test_writable_paths_are_empty_dirs(chart: helm_python.Chart) -> None:
    """With a read-only root filesystem, what the processes write goes to emptyDirs (or the
    etcd data volume)."""
    docs = render(chart)
    for name, cname, paths in (("agenttx", "agenttx", {"/tmp", "/var/lib/agenttx/data",
                                                      "/var/lib/agenttx/fs"}),
                               ("agenttx-operator", "operator", {"/tmp"})):
        dep = one(docs, "Deployment", name)
        vols = volumes(dep)
        by_path = {m["mountPath"]: m["name"] for m in container(dep, cname)["volumeMounts"]}
        for path in paths:
            assert "emptyDir" in vols[by_path[path]], (name, path)
    sts = one(docs, "StatefulSet", "agenttx-etcd")
    assert mounts(container(sts, "etcd"))["data"]["mountPath"] == "/var/lib/etcd"
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_service_account_token_stays_unmounted(chart: helm_python.Chart) -> None:
    for variant in ("default", "auth-token", "auth-mtls", "cert-manager"):
        docs = render(chart, VARIANTS[variant])
        assert pod_spec(one(docs, "Deployment", "agenttx"))["automountServiceAccountToken"] is False
        assert one(docs, "ServiceAccount", "agenttx")["automountServiceAccountToken"] is False
        assert pod_spec(one(docs, "StatefulSet", "agenttx-etcd"))[
            "automountServiceAccountToken"] is False


# ---- etcd TLS --------------------------------------------------------------------------

def etcd_args(docs: list[Doc]) -> dict[str, str]:
    args = container(one(docs, "StatefulSet", "agenttx-etcd"), "etcd")["args"]
    return dict(a.removeprefix("--").split("=", 1) for a in args)


def test_bundled_etcd_serves_mutual_tls(chart: helm_python.Chart) -> None:
    docs = render(chart)
    a = etcd_args(docs)
    assert a["listen-client-urls"] == "https://0.0.0.0:2379"
    assert a["listen-peer-urls"] == "https://0.0.0.0:2380"
    assert a["advertise-client-urls"].startswith("https://")
    assert a["initial-advertise-peer-urls"].startswith("https://")
    assert all(m.split("=", 1)[1].startswith("https://")
               for m in a["initial-cluster"].split(","))
    assert a["client-cert-auth"] == "true" and a["peer-client-cert-auth"] == "true"
    for flag, file in (("trusted-ca-file", "ca.crt"), ("cert-file", "tls.crt"),
                       ("key-file", "tls.key"), ("peer-trusted-ca-file", "ca.crt"),
                       ("peer-cert-file", "tls.crt"), ("peer-key-file", "tls.key")):
        assert a[flag] == f"/etc/etcd/tls/{file}", flag
    assert a["peer-cert-allowed-cn"] == "agenttx-etcd"
    assert a["experimental-peer-skip-client-san-verification"] == "true"
    # Probes keep working: /health on a plain-HTTP listener of its own, TCP for liveness.
    assert a["listen-metrics-urls"] == "http://0.0.0.0:2381"
    c = container(one(docs, "StatefulSet", "agenttx-etcd"), "etcd")
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert c["livenessProbe"]["tcpSocket"] == {"port": "client"}
    # The member certificate is mounted read-only where the flags point.
    sts = one(docs, "StatefulSet", "agenttx-etcd")
    assert mounts(c)["tls"] == {"name": "tls", "mountPath": "/etc/etcd/tls", "readOnly": True}
    assert volumes(sts)["tls"]["secret"]["secretName"] == "agenttx-etcd-tls"
    assert set(secret_data(one(docs, "Secret", "agenttx-etcd-tls"))) == {
        "ca.crt", "tls.crt", "tls.key"}


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    try:
        key.verify(cert.signature, cert.tbs_certificate_bytes,
                   ec.ECDSA(cert.signature_hash_algorithm))
    except Exception:
        return False
    return cert.issuer == ca.subject


def _matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == host


def test_generated_etcd_certificates_fit_the_cluster(chart: helm_python.Chart) -> None:
    docs = render(chart)
    member = secret_data(one(docs, "Secret", "agenttx-etcd-tls"))
    client = secret_data(one(docs, "Secret", "agenttx-etcd-client-tls"))
    assert member["ca.crt"] == client["ca.crt"]
    ca = _cert(member["ca.crt"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    server, peer_client = _cert(member["tls.crt"]), _cert(client["tls.crt"])
    assert _signed_by(server, ca) and _signed_by(peer_client, ca)
    # The private keys belong to the certificates.
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    for data, cert in ((member, server), (client, peer_client)):
        assert load_pem_private_key(data["tls.key"], None).public_key() == cert.public_key()

    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = san.get_values_for_type(x509.DNSName)
    a = etcd_args(docs)
    # Every name a client or a peer dials is covered.
    endpoint = env(container(one(docs, "Deployment", "agenttx"), "agenttx"))[
        "AGENTTX_ETCD_ENDPOINTS"]
    assert endpoint is not None
    dialled = [endpoint.rsplit(":", 1)[0]]
    dialled += [m.split("://", 1)[1].rsplit(":", 1)[0] for m in a["initial-cluster"].split(",")]
    dialled.append(f"agenttx-etcd-0.agenttx-etcd-peer.{NS}.svc.cluster.local")
    for host in dialled:
        assert any(_matches(n, host) for n in names), host
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)

    def cn(cert: x509.Certificate) -> str:
        return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)

    # Only the members' certificate passes --peer-cert-allowed-cn; the service's does not.
    assert cn(server) == a["peer-cert-allowed-cn"] != cn(peer_client)

    def usages(cert: x509.Certificate) -> set[Any]:
        return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= usages(server)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages(peer_client)


@pytest.mark.parametrize("variant", ["default", "cert-manager"])
def test_service_and_operator_connect_with_the_client_certificate(
        chart: helm_python.Chart, variant: str) -> None:
    docs = render(chart, VARIANTS[variant])
    for name, cname, prefix in (("agenttx", "agenttx", "AGENTTX_"),
                                ("agenttx-operator", "operator", "AGENTTX_OPERATOR_")):
        dep = one(docs, "Deployment", name)
        c = container(dep, cname)
        e = env(c)
        assert e[f"{prefix}ETCD_ENDPOINTS"] == f"agenttx-etcd.{NS}.svc:2379"
        assert (e[f"{prefix}ETCD_CA_FILE"], e[f"{prefix}ETCD_CERT_FILE"],
                e[f"{prefix}ETCD_KEY_FILE"]) == tuple(
            f"/etc/agenttx/etcd-tls/{f}" for f in ("ca.crt", "tls.crt", "tls.key"))
        assert mounts(c)["etcd-tls"] == {"name": "etcd-tls", "mountPath": "/etc/agenttx/etcd-tls",
                                         "readOnly": True}
        assert volumes(dep)["etcd-tls"]["secret"]["secretName"] == "agenttx-etcd-client-tls"
        # Mounted 0440: readable through the pod's fsGroup, by nobody else.
        assert volumes(dep)["etcd-tls"]["secret"]["defaultMode"] == 0o440
        assert pod_spec(dep)["securityContext"]["fsGroup"] == 10001


def test_etcd_certificates_from_cert_manager(chart: helm_python.Chart) -> None:
    docs = render(chart, CERT_MANAGER)
    assert find(docs, "Secret") == []  # cert-manager writes them
    certs = {c["metadata"]["name"]: c["spec"] for c in find(docs, "Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in find(docs, "Issuer")}
    # The release's own CA: self-signed root, then a CA issuer on it.
    assert issuers == {"agenttx-etcd-selfsigned": {"selfSigned": {}},
                       "agenttx-etcd-ca": {"ca": {"secretName": "agenttx-etcd-ca"}}}
    assert certs["agenttx-etcd-ca"]["isCA"] is True
    assert certs["agenttx-etcd-ca"]["issuerRef"]["name"] == "agenttx-etcd-selfsigned"
    ca_ref = {"name": "agenttx-etcd-ca", "kind": "Issuer", "group": "cert-manager.io"}
    member, client = certs["agenttx-etcd-tls"], certs["agenttx-etcd-client-tls"]
    assert member["issuerRef"] == client["issuerRef"] == ca_ref
    # The Secrets the Certificates write are the ones etcd and the clients mount.
    assert member["secretName"] == volumes(one(docs, "StatefulSet", "agenttx-etcd"))[
        "tls"]["secret"]["secretName"]
    assert client["secretName"] == volumes(one(docs, "Deployment", "agenttx"))[
        "etcd-tls"]["secret"]["secretName"]
    assert member["commonName"] == etcd_args(docs)["peer-cert-allowed-cn"]
    assert client["commonName"] != member["commonName"]
    assert f"agenttx-etcd.{NS}.svc" in member["dnsNames"]
    assert f"*.agenttx-etcd-peer.{NS}.svc" in member["dnsNames"]
    assert {"server auth", "client auth"} <= set(member["usages"])
    assert "client auth" in client["usages"] and "server auth" not in client["usages"]


def test_etcd_certificates_from_a_given_issuer(chart: helm_python.Chart) -> None:
    docs = render(chart, VARIANTS["cert-manager-etcd-own-issuer"])
    assert find(docs, "Issuer") == []
    refs = [c["spec"]["issuerRef"] for c in find(docs, "Certificate")]
    assert refs == [{"name": "etcd-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}] * 2


def test_etcd_tls_can_be_turned_off(chart: helm_python.Chart) -> None:
    docs = render(chart, VARIANTS["etcd-plaintext"])
    a = etcd_args(docs)
    assert a["listen-client-urls"] == "http://0.0.0.0:2379"
    assert not any(k.endswith(("-file", "cert-auth", "allowed-cn")) for k in a)
    assert find(docs, "Secret") == []
    e = env(container(one(docs, "Deployment", "agenttx"), "agenttx"))
    assert not any(k.startswith("AGENTTX_ETCD_") and k.endswith("_FILE") for k in e)


# ---- authentication --------------------------------------------------------------------

def test_kubernetes_auth_is_the_default(chart: helm_python.Chart,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart)
    s = service_settings(one(docs, "Deployment", "agenttx"), monkeypatch)
    assert (s.auth, s.auth_k8s_audience, s.auth_k8s_issuer) == ("kubernetes", "agenttx", None)
    assert s.service_namespace == NS  # from the downward API
    assert s.allow_unauthenticated is False and s.auth_tokens_file is None
    assert s.listen == "0.0.0.0:50051" and s.tls_cert_file is None
    op = env(container(one(docs, "Deployment", "agenttx-operator"), "operator"))
    assert op["AGENTTX_OPERATOR_JWKS_PUBLISH"] == "true"


def test_kubernetes_auth_issuer_and_audience(chart: helm_python.Chart,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart, {"auth": {"kubernetes": {
        "audience": "agents", "issuer": "https://kubernetes.default.svc.cluster.local"}}})
    s = service_settings(one(docs, "Deployment", "agenttx"), monkeypatch)
    assert s.auth_k8s_audience == "agents"
    assert s.auth_k8s_issuer == "https://kubernetes.default.svc.cluster.local"


def test_token_auth_reads_the_tokens_file_from_a_secret(chart: helm_python.Chart,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart, {"auth": {"mode": "token", "token": {
        "secretName": "agent-tokens", "key": "tokens.json"}}})
    dep = one(docs, "Deployment", "agenttx")
    s = service_settings(dep, monkeypatch)
    assert s.auth == "token"
    assert s.auth_tokens_file == "/etc/agenttx/auth/tokens.json"
    assert volumes(dep)["auth-tokens"] == {"name": "auth-tokens", "secret": {
        "secretName": "agent-tokens", "defaultMode": 0o440}}
    assert mounts(container(dep, "agenttx"))["auth-tokens"] == {
        "name": "auth-tokens", "mountPath": "/etc/agenttx/auth", "readOnly": True}
    assert "AGENTTX_AUTH_K8S_AUDIENCE" not in env(container(dep, "agenttx"))


def test_mtls_auth_needs_client_certificates(chart: helm_python.Chart,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart, VARIANTS["auth-mtls"])
    s = service_settings(one(docs, "Deployment", "agenttx"), monkeypatch)
    assert s.auth == "mtls"
    assert s.tls_client_ca_file == "/etc/agenttx/tls/ca.crt"
    for values in ({"auth": {"mode": "mtls"}},
                   {"auth": {"mode": "mtls"}, "tls": {"secretName": "serving"}}):
        with pytest.raises(helm_python.HelmError, match="auth.mode mtls: needs client certificates"):
            render(chart, values)


def test_no_auth_must_be_acknowledged(chart: helm_python.Chart,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(helm_python.HelmError, match="set auth.allowUnauthenticated=true"):
        render(chart, {"auth": {"mode": "none"}})
    docs = render(chart, VARIANTS["auth-none"])
    s = service_settings(one(docs, "Deployment", "agenttx"), monkeypatch)
    assert (s.auth, s.allow_unauthenticated) == ("none", True)


def test_admins_reach_the_service_as_its_admin_setting(chart: helm_python.Chart,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ops = "system:serviceaccount:agenttx-system:ops"
    oncall = "spiffe://cluster.local/ns/sre/sa/oncall"
    dep = one(render(chart, {"auth": {"admins": [ops, oncall]}}), "Deployment", "agenttx")
    assert env(container(dep, "agenttx"))["AGENTTX_AUTH_ADMINS"] == f"{ops},{oncall}"
    assert service_settings(dep, monkeypatch).admins() == frozenset({ops, oncall})


def test_no_admins_by_default(chart: helm_python.Chart,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    dep = one(render(chart), "Deployment", "agenttx")
    assert "AGENTTX_AUTH_ADMINS" not in env(container(dep, "agenttx"))
    assert service_settings(dep, monkeypatch).admins() == frozenset()


@pytest.mark.parametrize("admins", [["a,b"], [""], [" ops"], ["ops "], ["ops", "ops"], "ops",
                                    [7]])
def test_schema_rejects_admins_the_service_would_split_or_trim(chart: helm_python.Chart,
                                                             admins: Any) -> None:
    """A comma would split one principal into two, surrounding spaces would be trimmed
    away: the list must reach `--auth-admins` exactly as written."""
    with pytest.raises(helm_python.HelmError):
        chart.validate_schema({"auth": {"admins": admins}})
    chart.validate_schema({"auth": {"admins": ["CN with spaces", "system:serviceaccount:a:b"]}})


def test_token_auth_needs_its_secret(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmError, match="set auth.token.secretName"):
        render(chart, {"auth": {"mode": "token"}})


@pytest.mark.parametrize("values", [{"auth": {"mode": "basic"}},
                                    {"auth": {"allowUnauthenticated": "yes"}},
                                    {"auth": {"mode": "kubernetes", "oidc": {}}},
                                    {"tls": {"certManager": {"issuerRef": {"kind": "Vault"}}}},
                                    {"networkPolicy": {"clientNamespaceLabel": {"a": 1}}}])
def test_schema_rejects_bad_security_values(chart: helm_python.Chart,
                                            values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError):
        chart.validate_schema(values)


# ---- the operator's issuer-discovery RBAC ----------------------------------------------

ISSUER_DISCOVERY = f"{NS}-agenttx-operator-issuer-discovery"


def test_operator_may_read_exactly_the_issuer_discovery_urls(chart: helm_python.Chart) -> None:
    docs = render(chart)
    role = one(docs, "ClusterRole", ISSUER_DISCOVERY)
    assert role["rules"] == [{"nonResourceURLs": ["/.well-known/openid-configuration",
                                                  "/openid/v1/jwks"], "verbs": ["get"]}]
    # Nothing else in the chart grants non-resource URLs.
    assert [r for d in find(docs, "ClusterRole") + find(docs, "Role") for r in d["rules"]
            if "nonResourceURLs" in r] == role["rules"]
    binding = one(docs, "ClusterRoleBinding", ISSUER_DISCOVERY)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": ISSUER_DISCOVERY}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "agenttx-operator",
                                    "namespace": NS}]


@pytest.mark.parametrize("values", [
    {"auth": {"mode": "token", "token": {"secretName": "t"}}},
    {"operator": {"jwks": {"publish": False}}},
])
def test_issuer_keys_are_published_only_for_kubernetes_auth(chart: helm_python.Chart,
                                                            values: dict[str, Any]) -> None:
    docs = render(chart, values)
    assert find(docs, "ClusterRole", ISSUER_DISCOVERY) == []
    assert find(docs, "ClusterRoleBinding", ISSUER_DISCOVERY) == []
    e = env(container(one(docs, "Deployment", "agenttx-operator"), "operator"))
    assert e["AGENTTX_OPERATOR_JWKS_PUBLISH"] == "false"


def test_issuer_key_refresh_interval(chart: helm_python.Chart) -> None:
    docs = render(chart, {"operator": {"jwks": {"refreshSeconds": 60}}})
    e = env(container(one(docs, "Deployment", "agenttx-operator"), "operator"))
    assert e["AGENTTX_OPERATOR_JWKS_REFRESH_S"] == "60"


# ---- client TLS ------------------------------------------------------------------------

def test_tls_from_an_existing_secret(chart: helm_python.Chart,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart, VARIANTS["tls-secret"])
    dep = one(docs, "Deployment", "agenttx")
    s = service_settings(dep, monkeypatch)
    assert s.tls_cert_file == "/etc/agenttx/tls/tls.crt"
    assert s.tls_key_file == "/etc/agenttx/tls/tls.key"
    assert s.tls_client_ca_file is None  # no client certificates without clientAuth
    assert volumes(dep)["tls"] == {"name": "tls", "secret": {"secretName": "agenttx-serving",
                                                           "defaultMode": 0o440}}
    assert mounts(container(dep, "agenttx"))["tls"] == {
        "name": "tls", "mountPath": "/etc/agenttx/tls", "readOnly": True}
    assert find(docs, "Certificate") == []


def test_mtls_from_a_secret_uses_its_ca(chart: helm_python.Chart,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart, TLS_SECRET_MTLS)
    s = service_settings(one(docs, "Deployment", "agenttx"), monkeypatch)
    assert s.tls_client_ca_file == "/etc/agenttx/tls/ca.crt"
    assert s.auth == "kubernetes"  # transport mTLS and token auth combine


def test_tls_from_cert_manager(chart: helm_python.Chart) -> None:
    docs = render(chart, {"tls": {"certManager": {
        "enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
        "dnsNames": ["agenttx.example.com"]}}})
    cert = one(docs, "Certificate", "agenttx")["spec"]
    dep = one(docs, "Deployment", "agenttx")
    assert cert["secretName"] == "agenttx-tls" == volumes(dep)["tls"]["secret"]["secretName"]
    assert cert["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                 "group": "cert-manager.io"}
    assert cert["dnsNames"] == ["agenttx", f"agenttx.{NS}", f"agenttx.{NS}.svc",
                                f"agenttx.{NS}.svc.cluster.local", "agenttx.example.com"]
    # Client auth too: with tls.clientAuth the readiness probe presents this certificate.
    assert {"server auth", "client auth"} <= set(cert["usages"])
    assert cert["privateKey"]["rotationPolicy"] == "Always"
    assert (cert["duration"], cert["renewBefore"]) == ("2160h", "360h")
    e = env(container(dep, "agenttx"))
    assert e["AGENTTX_TLS_CERT_FILE"] == "/etc/agenttx/tls/tls.crt"


def test_cert_manager_secret_name_can_be_chosen(chart: helm_python.Chart) -> None:
    docs = render(chart, {"tls": {"secretName": "mine", "certManager": {
        "enabled": True, "issuerRef": {"name": "ca"}}}})
    assert one(docs, "Certificate", "agenttx")["spec"]["secretName"] == "mine"
    assert volumes(one(docs, "Deployment", "agenttx"))["tls"]["secret"]["secretName"] == "mine"


def test_cert_manager_needs_an_issuer(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmError, match="set tls.certManager.issuerRef.name"):
        render(chart, {"tls": {"certManager": {"enabled": True}}})


def test_tls_readiness_probe_runs_the_shipped_script(chart: helm_python.Chart) -> None:
    """The kubelet's gRPC probe is plaintext only: with TLS, readiness runs the chart's
    probe script (from a ConfigMap) over TLS, and liveness stays a TCP check."""
    docs = render(chart, VARIANTS["tls-secret"])
    dep = one(docs, "Deployment", "agenttx")
    c = container(dep, "agenttx")
    assert c["readinessProbe"]["exec"]["command"] == [
        "python", "/etc/agenttx/probe/tls_health_probe.py", "--port", "50051", "--timeout", "2"]
    assert "grpc" not in c["readinessProbe"]
    assert c["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert volumes(dep)["probe"]["configMap"]["name"] == "agenttx-probe"
    assert mounts(c)["probe"]["mountPath"] == "/etc/agenttx/probe"
    script = one(docs, "ConfigMap", "agenttx-probe")["data"]["tls_health_probe.py"]
    assert script == (CHART / "files" / "probes" / "tls_health_probe.py").read_text().rstrip("\n")
    assert find(render(chart), "ConfigMap", "agenttx-probe") == []  # plaintext: not needed


# ---- the Tiltfile's dev loop ------------------------------------------------------------

def tiltfile_dev_values() -> dict[str, Any]:
    """The Tiltfile's DEV_VALUES (`helm --set` strings), parsed by Helm's own parser."""
    import ast

    from support.chart import ROOT

    tree = ast.parse((ROOT / "Tiltfile").read_text())  # Starlark: Python syntax here
    (node,) = [n.value for n in tree.body if isinstance(n, ast.Assign)
               and [getattr(t, "id", "") for t in n.targets] == ["DEV_VALUES"]]
    values: dict[str, Any] = {}
    for expression in ast.literal_eval(node):  # one `--set` each, as Tilt passes them
        values = _merge(values, helm_python.parse_set_string(expression))
    return values


def _merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Later `--set` keys into earlier ones (what Helm's strvals.ParseInto does)."""
    out = dict(into)
    for key, value in new.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def test_the_dev_loop_keeps_authentication_and_drops_only_etcd_tls(
        chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tilt up` runs the chart's security defaults except the bundled etcd's TLS (Tilt's
    `helm template` would mint new etcd certificates on every run), and its dev
    ServiceAccount is an admin."""
    from support.chart import validate

    docs = render(chart, tiltfile_dev_values())
    for doc in docs:
        validate(doc)
    s = service_settings(one(docs, "Deployment", "agenttx"), monkeypatch)
    assert (s.auth, s.auth_k8s_audience) == ("kubernetes", "agenttx")
    assert s.admins() == frozenset({"system:serviceaccount:default:agenttx-dev"})
    assert s.etcd_ca_file is None and s.etcd_cert_file is None
    assert etcd_args(docs)["listen-client-urls"] == "http://0.0.0.0:2379"
    assert find(docs, "Secret") == []  # nothing generated, so nothing changes per run
    assert {p["metadata"]["name"] for p in find(docs, "NetworkPolicy")} == {
        "agenttx", "agenttx-etcd", "agenttx-operator"}
    assert find(docs, "ClusterRole", ISSUER_DISCOVERY)  # the operator publishes the keys


# ---- what helm install prints ----------------------------------------------------------

def test_install_notes_tell_agents_how_to_authenticate(chart: helm_python.Chart) -> None:
    from support.chart import notes

    text = notes(chart)
    assert "Authentication: kubernetes" in text
    assert "`authorization: Bearer <token>`" in text
    assert "audience: agenttx\n                expirationSeconds: 3600\n" in text
    assert "--audience agenttx" in text
    assert "kubectl label namespace <agent namespace> agenttx.io/client=true" in text
    assert "WARNING" not in text
    assert "issuer keys" in notes(chart, {"operator": {"enabled": False}})
    assert "WARNING: none." in notes(chart, VARIANTS["auth-none"])
    assert "(TLS, client certificates required)" in notes(chart, TLS_SECRET_MTLS)
