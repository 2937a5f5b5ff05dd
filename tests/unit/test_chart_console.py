"""The console in the chart (docs/console.md, "Kubernetes"), on the rendered manifests.

Pinned: nothing of it by default; with `console.enabled` one Recreate replica running
`agenttx console` with arguments the console's own parser accepts (so the pod would start,
not exit with a usage line), /healthz probes, a ClusterIP Service, a NetworkPolicy that
lets it reach only the service's gRPC port and DNS (ingress only from the peers given),
the service's NetworkPolicy admitting it, the service's CA (and never its key) when the
service serves TLS, HTTPS when given a Secret, and refusal of configurations where each
person's bearer token cannot be forwarded (client certificates).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import helm_python
import pytest

from agenttx.cli import build_parser
from agenttx.console import _listen
from support.chart import CHART, NS, VARIANTS, Doc, container, find, one, pod_spec, render

CONSOLE = "agenttx-console"
SELECTOR = {"app.kubernetes.io/name": "agenttx", "app.kubernetes.io/instance": "agenttx",
            "app.kubernetes.io/component": "console"}
SERVICE_PODS = {**SELECTOR, "app.kubernetes.io/component": "service"}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as c:
        yield c


def console_args(deployment: Doc) -> argparse.Namespace:
    """The container's arguments as `agenttx console` parses and checks them."""
    c = container(deployment, "console")
    ns = build_parser().parse_args(c["args"])
    _listen(ns)  # raises ValueError exactly where the console would refuse to start
    return ns


def test_no_console_by_default(chart):
    docs = render(chart)
    assert [d for d in docs if d["metadata"]["name"] == CONSOLE] == []


def test_the_console_deployment_runs_one_replica_that_would_start(chart):
    docs = render(chart, VARIANTS["console"])
    d = one(docs, "Deployment", CONSOLE)
    assert (d["spec"]["replicas"], d["spec"]["strategy"]["type"]) == (1, "Recreate")
    assert d["spec"]["selector"]["matchLabels"] == SELECTOR
    ns = console_args(d)
    assert ns.func.__module__ == "agenttx.console"
    assert (ns.target, ns.listen, ns.allow_insecure_remote) == (
        f"agenttx.{NS}.svc:50051", "0.0.0.0:8080", True)
    assert (ns.tls_cert_file, ns.tls_ca, ns.token) == (None, None, None)
    spec = pod_spec(d)
    assert spec["automountServiceAccountToken"] is False
    c = container(d, "console")
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTP"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert "env" not in c  # no credentials of its own, no etcd


def test_the_console_service_is_cluster_ip_on_its_port(chart):
    svc = one(render(chart, VARIANTS["console"]), "Service", CONSOLE)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"] == SELECTOR
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http",
                                     "protocol": "TCP", "appProtocol": "http"}]


def test_the_console_reaches_only_the_service_and_dns(chart):
    docs = render(chart, VARIANTS["console"])
    spec = one(docs, "NetworkPolicy", CONSOLE)["spec"]
    assert spec["podSelector"]["matchLabels"] == SELECTOR
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == []  # only kubectl port-forward (and the kubelet's probes)
    assert spec["egress"] == [
        {"ports": [{"port": 50051, "protocol": "TCP"}],
         "to": [{"podSelector": {"matchLabels": SERVICE_PODS}}]},
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]
    service_peers = one(docs, "NetworkPolicy", "agenttx")["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": SELECTOR}} in service_peers
    without = one(render(chart), "NetworkPolicy", "agenttx")["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": SELECTOR}} not in without


def test_extra_peers_may_reach_the_console_port(chart):
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}
    docs = render(chart, {"console": {"enabled": True, "networkPolicy": {"extraPeers": [peer]}}})
    assert one(docs, "NetworkPolicy", CONSOLE)["spec"]["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}], "from": [peer]}]


def test_https_and_the_services_ca(chart):
    docs = render(chart, VARIANTS["console-https-service-tls"])
    d = one(docs, "Deployment", CONSOLE)
    ns = console_args(d)
    assert (ns.tls_cert_file, ns.tls_key_file, ns.allow_insecure_remote) == (
        "/etc/agenttx/console-tls/tls.crt", "/etc/agenttx/console-tls/tls.key", False)
    assert (ns.tls_ca, ns.tls_server_name) == ("/etc/agenttx/service-ca/ca.crt",
                                               f"agenttx.{NS}.svc")
    volumes = {v["name"]: v for v in pod_spec(d)["volumes"]}
    assert volumes["service-ca"]["secret"] == {"secretName": "agenttx-serving",
                                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert volumes["console-tls"]["secret"] == {"secretName": "console-https"}
    assert container(d, "console")["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert one(docs, "Service", CONSOLE)["spec"]["ports"][0]["appProtocol"] == "https"


@pytest.mark.parametrize("values", [
    {"tls": {"secretName": "s", "clientAuth": True}},
    {"auth": {"mode": "mtls"}, "tls": {"secretName": "s", "clientAuth": True}},
])
def test_configurations_that_cannot_forward_a_persons_token_are_refused(chart, values):
    with pytest.raises(Exception, match="it cannot sign in people against a service that "
                                        "requires client certificates"):
        render(chart, {"console": {"enabled": True}, **values})


def test_unknown_console_values_are_refused(chart):
    with pytest.raises(Exception, match="console"):
        render(chart, {"console": {"enabled": True, "replicas": 2}})


def test_without_network_policies_the_console_has_none(chart):
    docs = render(chart, {"console": {"enabled": True}, "networkPolicy": {"enabled": False}})
    assert find(docs, "NetworkPolicy") == []
    assert one(docs, "Deployment", CONSOLE)


def test_the_notes_say_how_to_reach_the_console(chart):
    from support.chart import notes

    text = notes(chart, VARIANTS["console"])
    assert (f"  kubectl -n {NS} port-forward svc/{CONSOLE} 8080:8080\n" in text
            and "at http://127.0.0.1:8080 after" in text)
    assert "port-forward svc/agenttx-console" not in notes(chart)
