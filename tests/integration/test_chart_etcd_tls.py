"""The chart's bundled etcd, run for real: its rendered flags and generated certificates.

A Kubernetes cluster is not needed to know whether the StatefulSet's etcd command line
works. This test renders the chart offline, writes the generated Secrets to disk, and
starts a 3-member cluster from the rendered container args with only the addresses
rewritten to loopback ports (schemes, TLS flags, CommonName rules and certificates stay
exactly as rendered). Then it checks what the manifests promise: the members form a
cluster over mutual TLS, the readiness probe's plain-HTTP /health answers, the service's
own etcd client connects with the chart's client certificate, and everything else (no
certificate, another release's certificate, the client certificate on the peer port)
is refused.
"""

from __future__ import annotations

import http.client
import json
import pathlib
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import helm_python
import pytest

from agenttx.embedded_etcd import find_etcd_binary, free_port
from agenttx.errors import StoreUnavailable
from agenttx.store.client import connect
from support.chart import CHART, NS, container, env, one, render, secret_data
from support.waiting import eventually, slack

DOMAIN = f"agenttx-etcd-peer.{NS}.svc"


@dataclass
class Member:
    name: str
    client: int
    peer: int
    metrics: int
    process: subprocess.Popen[bytes] | None = None


def write_secret(data: dict[str, bytes], folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True)
    for key, value in data.items():
        (folder / key).write_bytes(value)
        (folder / key).chmod(0o400)
    return folder


def loopback_args(args: list[str], me: Member, members: list[Member], data: pathlib.Path,
                  certs: pathlib.Path) -> list[str]:
    """The rendered args with pod names, DNS names and 0.0.0.0 turned into loopback ports."""
    out = []
    for arg in args:
        arg = arg.replace("$(POD_NAME)", me.name)
        for m in members:
            arg = arg.replace(f"{m.name}.{DOMAIN}:2380", f"127.0.0.1:{m.peer}")
            arg = arg.replace(f"{m.name}.{DOMAIN}:2379", f"127.0.0.1:{m.client}")
        arg = (arg.replace("0.0.0.0:2379", f"127.0.0.1:{me.client}")
               .replace("0.0.0.0:2380", f"127.0.0.1:{me.peer}")
               .replace("0.0.0.0:2381", f"127.0.0.1:{me.metrics}")
               .replace("/etc/etcd/tls", str(certs)))
        if arg.startswith("--data-dir="):
            arg = f"--data-dir={data / me.name}"
        out.append(arg)
    return out


@dataclass
class Cluster:
    members: list[Member]
    client_certs: pathlib.Path
    member_certs: pathlib.Path
    other_release_certs: pathlib.Path
    service_env: dict[str, str | None]
    readiness_path: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("chart-etcd")
    with helm_python.Chart.load(CHART) as chart:
        docs = render(chart)
        other = render(chart)  # a second offline render: a different CA
    sts = one(docs, "StatefulSet", "agenttx-etcd")
    etcd = container(sts, "etcd")
    assert etcd["command"] == ["etcd"]
    member_certs = write_secret(secret_data(one(docs, "Secret", "agenttx-etcd-tls")),
                                root / "member-tls")
    client_certs = write_secret(secret_data(one(docs, "Secret", "agenttx-etcd-client-tls")),
                                root / "client-tls")
    other_certs = write_secret(secret_data(one(other, "Secret", "agenttx-etcd-client-tls")),
                               root / "other-release-tls")
    members = [Member(f"agenttx-etcd-{i}", free_port(), free_port(), free_port())
               for i in range(sts["spec"]["replicas"])]
    binary = find_etcd_binary()
    log = open(root / "etcd.log", "ab")  # noqa: SIM115 - handed to the children
    try:
        for m in members:
            cmd = [binary, *loopback_args(etcd["args"], m, members, root / "data", member_certs)]
            m.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        probe = etcd["readinessProbe"]["httpGet"]
        assert probe["port"] == "metrics"
        yield Cluster(members, client_certs, member_certs, other_certs,
                      env(container(one(docs, "Deployment", "agenttx"), "agenttx")),
                      probe["path"])
    finally:
        for m in members:
            if m.process and m.process.poll() is None:
                m.process.terminate()
        for m in members:
            if m.process:
                try:
                    m.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    m.process.kill()
                    m.process.wait()
        log.close()


def wait_ready(cluster: Cluster, timeout: float = slack(10.0)) -> None:
    """Wait until every member's readiness endpoint reports health (quorum reached; etcd's
    own start-up, as for the harness's embedded etcd)."""
    def ready(m) -> bool:
        if m.process is None or m.process.poll() is not None:
            raise RuntimeError(f"{m.name} exited")  # not retried: fails at once
        try:
            url = f"http://127.0.0.1:{m.metrics}{cluster.readiness_path}"
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        except OSError:
            return False
    for m in cluster.members:
        eventually(lambda m=m: ready(m), timeout, f"{m.name} reports health")


def test_members_form_a_cluster_over_mutual_tls(cluster: Cluster) -> None:
    wait_ready(cluster)
    # The client port speaks TLS only: plain HTTP gets no answer there.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{cluster.members[0].client}/health",
                               timeout=2).read()


def files(folder: pathlib.Path, cert: bool = True) -> dict[str, str | None]:
    return {"ca_file": str(folder / "ca.crt"),
            "cert_file": str(folder / "tls.crt") if cert else None,
            "key_file": str(folder / "tls.key") if cert else None}


async def test_the_services_client_connects_with_the_chart_certificate(cluster: Cluster) -> None:
    wait_ready(cluster)
    e = cluster.service_env
    # The files the service is told to use are the client Secret's keys.
    mounted = {k: v.replace("/etc/agenttx/etcd-tls", str(cluster.client_certs))
               for k, v in (("ca_file", e["AGENTTX_ETCD_CA_FILE"]),
                            ("cert_file", e["AGENTTX_ETCD_CERT_FILE"]),
                            ("key_file", e["AGENTTX_ETCD_KEY_FILE"])) if v}
    # One DNS name, as in the chart (the client Service); "localhost" is among the SANs.
    assert e["AGENTTX_ETCD_ENDPOINTS"] == f"agenttx-etcd.{NS}.svc:2379"
    store = connect([f"localhost:{cluster.members[0].client}"], timeout=5.0, **mounted)
    try:
        await store.put(b"/chart-tls/key", b"value")
        kv = await store.get(b"/chart-tls/key")
        assert kv is not None and kv.value == b"value"
    finally:
        await store.close()


async def test_several_ip_endpoints_with_tls_verify_against_the_first_host(cluster: Cluster) -> None:
    """An `ipv4:a,b,c` target names no host; the client checks the first endpoint's."""
    wait_ready(cluster)
    e = cluster.service_env
    mounted = {k: v.replace("/etc/agenttx/etcd-tls", str(cluster.client_certs))
               for k, v in (("ca_file", e["AGENTTX_ETCD_CA_FILE"]),
                            ("cert_file", e["AGENTTX_ETCD_CERT_FILE"]),
                            ("key_file", e["AGENTTX_ETCD_KEY_FILE"])) if v}
    store = connect([f"127.0.0.1:{m.client}" for m in cluster.members], timeout=5.0, **mounted)
    try:
        await store.put(b"/chart-tls/ips", b"value")
        assert (await store.get(b"/chart-tls/ips")).value == b"value"
    finally:
        await store.close()


@pytest.mark.parametrize("who", ["no client certificate", "another release's certificate"])
async def test_etcd_refuses_other_clients(cluster: Cluster, who: str) -> None:
    wait_ready(cluster)
    tls = (files(cluster.client_certs, cert=False) if who == "no client certificate"
           else dict(files(cluster.other_release_certs),
                     ca_file=str(cluster.client_certs / "ca.crt")))
    store = connect([f"127.0.0.1:{cluster.members[0].client}"], timeout=3.0, **tls)
    try:
        with pytest.raises(StoreUnavailable):
            await store.put(b"/chart-tls/intruder", b"x")
    finally:
        await store.close()


def peer_get(cluster: Cluster, certs: pathlib.Path) -> int:
    ctx = ssl.create_default_context(cafile=str(cluster.member_certs / "ca.crt"))
    ctx.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.members[0].peer, context=ctx,
                                       timeout=5)
    try:
        conn.request("GET", "/members")
        return conn.getresponse().status
    finally:
        conn.close()


def test_only_members_may_use_the_peer_port(cluster: Cluster) -> None:
    wait_ready(cluster)
    assert peer_get(cluster, cluster.member_certs) == 200
    # Same CA, but not the members' CommonName (--peer-cert-allowed-cn).
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        peer_get(cluster, cluster.client_certs)
