"""The chart's TLS readiness probe (files/probes/tls_health_probe.py) against a real server.

With TLS the kubelet's own gRPC probe cannot be used (it speaks plaintext only), so the
chart runs this script as an exec probe. Here it runs exactly as the kubelet would run
it (the rendered command and the rendered container env, with the Secret's mount path
pointed at a temporary folder) against a real grpc server serving grpc.health.v1 over
TLS and mutual TLS, and its exit code must follow the served status.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
import helm_python
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from support.chart import CHART, TLS_SECRET_MTLS, VARIANTS, container, one, render

SERVICE_DNS = "agenttx.agenttx-system.svc"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def issue(folder: pathlib.Path, sans: list[x509.GeneralName], *,
          client_auth: bool = True) -> pathlib.Path:
    """A CA and a serving certificate signed by it, laid out like a kubernetes.io/tls
    Secret with ca.crt (what the chart mounts at /etc/agenttx/tls)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("test-ca")).issuer_name(_name("test-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH]
                                                  if client_auth else [])
    cert = (x509.CertificateBuilder().subject_name(_name("agenttx")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True)
    pem = serialization.Encoding.PEM
    (folder / "ca.crt").write_bytes(ca.public_bytes(pem))
    (folder / "tls.crt").write_bytes(cert.public_bytes(pem))
    (folder / "tls.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return folder


@dataclass
class Server:
    port: int
    health: health.HealthServicer


@pytest.fixture
def serve() -> Iterator[object]:
    servers: list[grpc.Server] = []

    def start(certs: pathlib.Path, require_client_cert: bool) -> Server:
        creds = grpc.ssl_server_credentials(
            [((certs / "tls.key").read_bytes(), (certs / "tls.crt").read_bytes())],
            root_certificates=(certs / "ca.crt").read_bytes() if require_client_cert else None,
            require_client_auth=require_client_cert)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_secure_port("127.0.0.1:0", creds)
        server.start()
        servers.append(server)
        return Server(port, servicer)

    yield start
    for s in servers:
        s.stop(grace=None)


def rendered_probe(values: dict[str, object]) -> tuple[list[str], dict[str, str]]:
    with helm_python.Chart.load(CHART) as chart:
        c = container(one(render(chart, values), "Deployment", "agenttx"), "agenttx")
    return c["readinessProbe"]["exec"]["command"], {
        e["name"]: e["value"] for e in c["env"] if e["name"].startswith("AGENTTX_TLS_")}


def run_probe(values: dict[str, object], certs: pathlib.Path, port: int,
              *extra: str) -> subprocess.CompletedProcess[str]:
    command, tls_env = rendered_probe(values)
    assert command[:2] == ["python", "/etc/agenttx/probe/tls_health_probe.py"]
    args = command[2:]
    args[args.index("--port") + 1] = str(port)
    environment = {k: v.replace("/etc/agenttx/tls", str(certs)) for k, v in tls_env.items()}
    environment["PATH"] = os.environ.get("PATH", "")
    script = str(CHART / "files" / "probes" / "tls_health_probe.py")
    return subprocess.run([sys.executable, "-B", script, *args, *extra], env=environment,
                          capture_output=True, text=True, timeout=30)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_probe_follows_the_served_status_over_tls(tmp_path: pathlib.Path, serve) -> None:
    certs = issue(tmp_path / "tls", [x509.DNSName(SERVICE_DNS)])
    server = serve(certs, require_client_cert=False)
    server.health.set("", SERVING)
    ok = run_probe(VARIANTS["tls-secret"], certs, server.port)
    assert (ok.returncode, ok.stdout) == (0, "(server): SERVING\n"), ok.stderr
    server.health.set("", NOT_SERVING)  # what the service answers while etcd is unreachable
    down = run_probe(VARIANTS["tls-secret"], certs, server.port)
    assert (down.returncode, down.stdout) == (1, "(server): NOT_SERVING\n")
    server.health.set("agenttx.v1.AgentTxService", SERVING)
    named = run_probe(VARIANTS["tls-secret"], certs, server.port,
                      "--service", "agenttx.v1.AgentTxService")
    assert named.returncode == 0, named.stderr


def test_probe_presents_the_serving_certificate_under_mtls(tmp_path: pathlib.Path,
                                                           serve) -> None:
    certs = issue(tmp_path / "tls", [x509.DNSName("*.agenttx-system.svc")])
    server = serve(certs, require_client_cert=True)
    server.health.set("", SERVING)
    ok = run_probe(TLS_SECRET_MTLS, certs, server.port)
    assert ok.returncode == 0, ok.stderr
    # Without tls.clientAuth the probe presents no certificate, and the server refuses it.
    refused = run_probe(VARIANTS["tls-secret"], certs, server.port)
    assert refused.returncode == 2
    assert refused.stderr.startswith("health check failed: UNAVAILABLE")


def test_probe_verifies_the_certificate_it_is_served(tmp_path: pathlib.Path, serve) -> None:
    served = issue(tmp_path / "served", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server = serve(served, require_client_cert=False)
    server.health.set("", SERVING)
    assert run_probe(VARIANTS["tls-secret"], served, server.port).returncode == 0
    # A Secret whose CA did not sign what the port serves: not ready.
    other = issue(tmp_path / "other", [x509.DNSName(SERVICE_DNS)])
    (tmp_path / "mixed").mkdir()
    for name, source in (("ca.crt", other), ("tls.crt", served), ("tls.key", served)):
        (tmp_path / "mixed" / name).write_bytes((source / name).read_bytes())
    wrong = run_probe(VARIANTS["tls-secret"], tmp_path / "mixed", server.port)
    assert wrong.returncode == 2 and "UNAVAILABLE" in wrong.stderr


def test_probe_reports_a_closed_port(tmp_path: pathlib.Path) -> None:
    from agenttx.embedded_etcd import free_port

    certs = issue(tmp_path / "tls", [x509.DNSName(SERVICE_DNS)])
    result = run_probe(VARIANTS["tls-secret"], certs, free_port())
    assert result.returncode == 2 and "UNAVAILABLE" in result.stderr
