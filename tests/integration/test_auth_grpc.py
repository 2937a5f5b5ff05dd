"""Client TLS, mTLS and token authentication on a real grpc.aio server
(docs/security.md#authentication---auth).

A tiny real server on loopback: the standard health service plus `WhoAmI`, which
answers the Principal the Authenticator derived from the call (or its refusal, through
the project's status table). Real certificates from tests/support/certs.py; rotation
is real files renamed over the served ones. Waits are for conditions, never for time.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agenttx import errors
from agenttx.api.status import status_for
from agenttx.auth import Authenticator, ReloadingCertificates, TokenFile, hash_token, server_credentials
from support.certs import CertificateAuthority, Issued, spiffe_id, write_atomically
from support.waiting import eventually_async, slack

ECHO = "agenttx.test.Echo"
TIMEOUT_S = 10.0


@asynccontextmanager
async def echo_server(credentials: grpc.ServerCredentials | None,
                      authenticator: Authenticator) -> AsyncIterator[str]:
    """A real grpc.aio server on an ephemeral loopback port; yields its address."""

    async def whoami(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            p = await authenticator.authenticate_call(context)
        except errors.AgentTxError as exc:
            await context.abort(status_for(exc), str(exc))
        return json.dumps({"name": p.name, "namespace": p.namespace,
                           "roles": sorted(p.roles)}).encode()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        ECHO, {"WhoAmI": grpc.unary_unary_rpc_method_handler(whoami)}),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await authenticator.start()
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
        await authenticator.stop()


# Every channel gets its own connection (no sharing through grpc's global subchannel
# pool), so "a new connection" in these tests really is one.
OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


def tls(ca: CertificateAuthority, client: Issued | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None)


async def whoami(address: str, creds: grpc.ChannelCredentials | None,
                 metadata: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    channel = (grpc.aio.secure_channel(address, creds, options=OPTIONS) if creds
               else grpc.aio.insecure_channel(address, options=OPTIONS))
    async with channel:
        call = channel.unary_unary(f"/{ECHO}/WhoAmI")
        answer = await call(b"", metadata=metadata or None, timeout=TIMEOUT_S)
        return dict(json.loads(answer))


async def refused(call: Awaitable[Any], code: grpc.StatusCode, details: str | None = None) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, (err.value.code(), err.value.details())
    if details is not None:
        assert err.value.details() == details
    return err.value.details() or ""


async def succeeds(address: str, creds: grpc.ChannelCredentials) -> bool:
    try:
        await whoami(address, creds)
        return True
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        return False


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority("AgentTx Test CA")


@pytest.fixture(scope="module")
def other_ca() -> CertificateAuthority:
    return CertificateAuthority("Some Other CA")


@pytest.fixture
def server_files(tmp_path: pathlib.Path, ca: CertificateAuthority) -> tuple[str, str]:
    cert, key = ca.server().write(tmp_path, "server")
    return str(cert), str(key)


@pytest.fixture
def token_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(json.dumps({"tokens": [
        {"sha256": hash_token("billing-secret"), "principal": "billing-agent",
         "namespace": "team-a", "roles": ["agent"]},
        {"sha256": hash_token("ops-secret"), "principal": "ops", "roles": ["admin"]}]}))
    return path


async def test_plaintext_client_is_refused_by_a_tls_server(
        server_files: tuple[str, str], ca: CertificateAuthority) -> None:
    async with echo_server(server_credentials(*server_files), Authenticator("none")) as address:
        await refused(whoami(address, None), grpc.StatusCode.UNAVAILABLE)
        assert await whoami(address, tls(ca)) == {"name": "", "namespace": None, "roles": []}


async def test_health_is_served_over_tls(server_files: tuple[str, str],
                                         ca: CertificateAuthority) -> None:
    async with echo_server(server_credentials(*server_files), Authenticator("none")) as address:
        async with grpc.aio.secure_channel(address, tls(ca), options=OPTIONS) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_client_refuses_a_server_certificate_from_an_unknown_ca(
        server_files: tuple[str, str], other_ca: CertificateAuthority) -> None:
    async with echo_server(server_credentials(*server_files), Authenticator("none")) as address:
        await refused(whoami(address, tls(other_ca)), grpc.StatusCode.UNAVAILABLE)


async def test_bearer_tokens_over_tls(server_files: tuple[str, str], ca: CertificateAuthority,
                                      token_file: pathlib.Path) -> None:
    auth = Authenticator("token", tokens=TokenFile(token_file))
    async with echo_server(server_credentials(*server_files), auth) as address:
        creds = tls(ca)
        assert await whoami(address, creds, (("authorization", "Bearer billing-secret"),)) == {
            "name": "billing-agent", "namespace": "team-a", "roles": ["agent"]}
        assert await whoami(address, creds, (("authorization", "bearer ops-secret"),)) == {
            "name": "ops", "namespace": None, "roles": ["admin"]}
        await refused(whoami(address, creds), grpc.StatusCode.UNAUTHENTICATED, "missing credentials")
        await refused(whoami(address, creds, (("authorization", "Bearer guessed"),)),
                      grpc.StatusCode.UNAUTHENTICATED, "invalid credentials")
        await refused(whoami(address, creds, (("authorization", "Basic b3BzOm9wcw=="),)),
                      grpc.StatusCode.UNAUTHENTICATED, "invalid credentials")


async def test_token_rotation_without_restart(tmp_path: pathlib.Path, token_file: pathlib.Path) -> None:
    # plaintext on loopback: this test is about the token file, not TLS
    auth = Authenticator("token", tokens=TokenFile(token_file, check_interval_s=0))
    async with echo_server(None, auth) as address:
        old = (("authorization", "Bearer billing-secret"),)
        new = (("authorization", "Bearer billing-secret-2"),)
        assert (await whoami(address, None, old))["name"] == "billing-agent"
        write_atomically(token_file, json.dumps({"tokens": [
            {"sha256": hash_token("billing-secret-2"), "principal": "billing-agent",
             "namespace": "team-a"}]}))
        assert (await whoami(address, None, new))["name"] == "billing-agent"
        await refused(whoami(address, None, old), grpc.StatusCode.UNAUTHENTICATED,
                      "invalid credentials")


async def test_mtls_without_a_client_certificate_is_refused(
        tmp_path: pathlib.Path, server_files: tuple[str, str], ca: CertificateAuthority) -> None:
    ca_file = ca.write(tmp_path)
    creds = server_credentials(*server_files, str(ca_file))
    async with echo_server(creds, Authenticator("mtls")) as address:
        await refused(whoami(address, tls(ca)), grpc.StatusCode.UNAVAILABLE)


async def test_mtls_client_certificate_from_another_ca_is_refused(
        tmp_path: pathlib.Path, server_files: tuple[str, str], ca: CertificateAuthority,
        other_ca: CertificateAuthority) -> None:
    creds = server_credentials(*server_files, str(ca.write(tmp_path)))
    stranger = other_ca.client(uris=[spiffe_id("team-a", "billing-agent")])
    async with echo_server(creds, Authenticator("mtls")) as address:
        await refused(whoami(address, tls(ca, stranger)), grpc.StatusCode.UNAVAILABLE)


async def test_mtls_principal_from_the_client_certificate(
        tmp_path: pathlib.Path, server_files: tuple[str, str], ca: CertificateAuthority) -> None:
    creds = server_credentials(*server_files, str(ca.write(tmp_path)))
    spiffe = ca.client("ignored", uris=[spiffe_id("team-a", "billing-agent")])
    cn_only = ca.client("batch-runner")
    async with echo_server(creds, Authenticator("mtls")) as address:
        assert await whoami(address, tls(ca, spiffe)) == {
            "name": "spiffe://cluster.local/ns/team-a/sa/billing-agent", "namespace": "team-a",
            "roles": []}
        assert await whoami(address, tls(ca, cn_only)) == {
            "name": "batch-runner", "namespace": None, "roles": []}


async def test_certificate_rotation_is_picked_up_without_restart(
        tmp_path: pathlib.Path, ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
    cert, key = ca.server().write(tmp_path, "server")
    certs = ReloadingCertificates(str(cert), str(key), check_interval_s=0)
    async with echo_server(certs.credentials(), Authenticator("none")) as address:
        assert await succeeds(address, tls(ca))
        assert not await succeeds(address, tls(other_ca))
        kept = grpc.aio.secure_channel(address, tls(ca), options=OPTIONS)
        await kept.unary_unary(f"/{ECHO}/WhoAmI")(b"", timeout=TIMEOUT_S)

        # Half a rotation (new certificate, old key): the server keeps the old pair.
        renewed = other_ca.server()
        write_atomically(cert, renewed.cert_pem)
        assert await succeeds(address, tls(ca))
        assert not await succeeds(address, tls(other_ca))

        # The key arrives: new connections get the new certificate, no restart.
        write_atomically(key, renewed.key_pem)
        # check_interval_s=0: the next handshake re-reads the files
        await eventually_async(lambda: succeeds(address, tls(other_ca)), slack(0.5),
                               "a new connection is served the rotated certificate")
        assert not await succeeds(address, tls(ca))
        assert certs.generation == 2

        # The connection made before the rotation keeps working.
        await kept.unary_unary(f"/{ECHO}/WhoAmI")(b"", timeout=TIMEOUT_S)
        await kept.close()
