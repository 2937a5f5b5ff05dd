"""Readiness probe of the AgentTx service when it serves TLS: one grpc.health.v1 Check.

Why it exists: the kubelet's built-in gRPC probe connects in plaintext only, so it cannot
reach a service that serves TLS (or requires client certificates). The chart mounts this
file from a ConfigMap and runs it as an exec probe inside the service container, where
the image's Python has grpcio, grpcio-health-checking and cryptography, and the
container's own AGENTTX_TLS_* settings say where the certificate files are.

It checks the process it runs beside, so it trusts the certificate the way a client in
the cluster would: the Secret's ca.crt (else the system roots), for the first DNS name
of the served certificate (else its first IP address or its CommonName). With
AGENTTX_TLS_CLIENT_CA_FILE set (mTLS) it presents the served certificate as its client
certificate. It must never write anything (the root filesystem is read-only) and never
print key material. (Its name must not shadow a module it imports: Python puts the
script's folder first on sys.path.)

Exit codes: 0 SERVING; 1 any other status; 2 the check could not be made.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc


def server_name(cert_pem: bytes) -> str:
    """The name to verify the served certificate against."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        dns = san.get_values_for_type(x509.DNSName)
        if dns:
            # A wildcard matches any one label in its place.
            return dns[0].replace("*", "probe", 1) if dns[0].startswith("*.") else dns[0]
        ips = san.get_values_for_type(x509.IPAddress)
        if ips:
            return str(ips[0])
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if common:
        return str(common[0].value)
    raise ValueError("the served certificate has no DNS name, IP address or CommonName")


def credentials(env: dict[str, str]) -> tuple[grpc.ChannelCredentials, str]:
    cert_file = env.get("AGENTTX_TLS_CERT_FILE")
    key_file = env.get("AGENTTX_TLS_KEY_FILE")
    if not cert_file or not key_file:
        raise ValueError("AGENTTX_TLS_CERT_FILE and AGENTTX_TLS_KEY_FILE are not set")
    cert = pathlib.Path(cert_file).read_bytes()
    ca_file = pathlib.Path(cert_file).with_name("ca.crt")
    roots = ca_file.read_bytes() if ca_file.is_file() else None
    if env.get("AGENTTX_TLS_CLIENT_CA_FILE"):
        creds = grpc.ssl_channel_credentials(
            root_certificates=roots, private_key=pathlib.Path(key_file).read_bytes(),
            certificate_chain=cert)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=roots)
    return creds, server_name(cert)


def check(port: int, service: str, timeout: float, env: dict[str, str]) -> int:
    creds, name = credentials(env)
    options = [("grpc.ssl_target_name_override", name), ("grpc.default_authority", name)]
    with grpc.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{service or '(server)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="gRPC port on 127.0.0.1")
    parser.add_argument("--service", default="", help='health service name ("" = the server)')
    parser.add_argument("--timeout", type=float, default=2.0, help="RPC deadline, seconds")
    args = parser.parse_args(argv)
    try:
        return check(args.port, args.service, args.timeout, dict(os.environ))
    except grpc.RpcError as e:
        print(f"health check failed: {e.code().name}: {e.details()}", file=sys.stderr)
    except (OSError, ValueError) as e:
        print(f"health check failed: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
