"""The client's transport: TLS with a private CA, mTLS, the bearer token, and which
calls it retries or re-sends.

A real gRPC server sits in front of the real replica and forwards every call unchanged,
recording the metadata and the client certificate it saw (what the replica itself sees
is covered by test_security.py). It can also answer UNAVAILABLE to the next calls of a
method without forwarding them, the way a restarting replica does, or forward them and
then answer UNAVAILABLE, the way a connection that breaks after the work was done does.
The client talks to it exactly as it will to a replica.
"""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
import threading
from concurrent import futures
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agenttx.client import TLS, AsyncClient, Client, OutcomeUnknown, Unavailable


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: Any, issuer: x509.Name, issuer_key: Any, *, ca: bool = False,
          dns: list[str] | None = None, ips: list[str] | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns or []]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips or []]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem_key(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Pki:
    def __init__(self, root: pathlib.Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("agenttx test CA", ca_key, _name("agenttx test CA"), ca_key, ca=True)
        server_key = ec.generate_private_key(ec.SECP256R1())
        server = _cert("agenttx.test", server_key, ca.subject, ca_key, dns=["agenttx.test"])
        client_key = ec.generate_private_key(ec.SECP256R1())
        client = _cert("billing-agent", client_key, ca.subject, ca_key)
        self.ca = root / "ca.pem"
        self.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.server_cert = server.public_bytes(serialization.Encoding.PEM)
        self.server_key = _pem_key(server_key)
        self.client_cert = root / "client.pem"
        self.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
        self.client_key = root / "client-key.pem"
        self.client_key.write_bytes(_pem_key(client_key))


class Front(grpc.GenericRpcHandler):
    """A real gRPC server forwarding raw requests to the replica (TLS when given a Pki).
    `fail[method] = n` answers the next n calls of `method` UNAVAILABLE instead;
    `lose[method] = n` forwards them and then answers UNAVAILABLE (the answer is lost)."""

    def __init__(self, upstream: str, pki: Pki | None = None) -> None:
        self.channel = grpc.insecure_channel(upstream)
        self.seen: list[dict[str, Any]] = []
        self.fail: dict[str, int] = {}
        self.lose: dict[str, int] = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((self,))
        if pki is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            creds = grpc.ssl_server_credentials([(pki.server_key, pki.server_cert)],
                                                root_certificates=pki.ca.read_bytes(),
                                                require_client_auth=True)
            self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.server.start()

    def calls(self, method: str) -> int:
        with self.lock:
            return sum(1 for c in self.seen if c["method"].endswith("/" + method))

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        name = method.rsplit("/", 1)[1]
        forward = self.channel.unary_unary(method)

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            auth = context.auth_context()
            with self.lock:
                self.seen.append({
                    "method": method,
                    "metadata": dict(context.invocation_metadata()),
                    "client_cn": [v.decode() for v in auth.get("x509_common_name", [])],
                })
                failing = self.fail.get(name, 0) > 0
                if failing:
                    self.fail[name] -= 1
                losing = not failing and self.lose.get(name, 0) > 0
                if losing:
                    self.lose[name] -= 1
            if failing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "front: replica restarting")
            try:
                answer = forward(request, timeout=context.time_remaining())
            except grpc.RpcError as err:
                context.abort(err.code(), err.details() or "")
                raise
            if losing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "front: connection reset")
            return answer  # type: ignore[no-any-return]

        return grpc.unary_unary_rpc_method_handler(handle)

    def close(self) -> None:
        self.server.stop(None)
        self.channel.close()


@pytest.fixture(scope="module")
def pki(scratch) -> Pki:
    return Pki(scratch / "client-tls")


@pytest.fixture(scope="module")
def front(replicas, pki):
    f = Front(replicas[0].target, pki)
    yield f
    f.close()


def _mtls(pki: Pki) -> TLS:
    return TLS(ca=pki.ca, cert=pki.client_cert, key=pki.client_key, server_name="agenttx.test")


def test_mtls_with_a_private_ca_and_a_bearer_token(front, pki, uniq):
    with Client(f"127.0.0.1:{front.port}", tls=_mtls(pki), token="s3cret-token") as client:
        with client.transaction(agent_id=f"tls-{uniq}") as tx:
            assert tx.step("kv.put", {"key": f"tls-{uniq}", "value": 1}).ok
    calls = [c for c in front.seen if c["metadata"].get("authorization") == "Bearer s3cret-token"]
    assert [c["method"].rsplit("/", 1)[1] for c in calls] == \
        ["BeginTransaction", "ExecuteStep", "CommitTransaction"]
    assert all(c["client_cn"] == ["billing-agent"] for c in calls)


async def test_the_async_client_speaks_mtls_too(front, pki, uniq):
    async with AsyncClient(f"127.0.0.1:{front.port}", tls=_mtls(pki)) as client:
        async with client.transaction(agent_id=f"atls-{uniq}") as tx:
            assert (await tx.step("kv.put", {"key": f"atls-{uniq}", "value": 1})).ok
    mine = [c for c in front.seen if c["method"].endswith("ExecuteStep")
            and "authorization" not in c["metadata"]]
    assert mine and mine[-1]["client_cn"] == ["billing-agent"]


@pytest.mark.parametrize("tls", [
    pytest.param(lambda pki: TLS(ca=pki.ca, server_name="agenttx.test"), id="no-client-cert"),
    pytest.param(lambda pki: TLS(ca=pki.ca, cert=pki.client_cert, key=pki.client_key),
                 id="server-name-mismatch"),
    pytest.param(lambda pki: True, id="system-roots"),
    pytest.param(lambda pki: None, id="plaintext"),
])
def test_a_wrong_tls_setup_never_reaches_the_service(front, pki, tls):
    before = len(front.seen)
    with Client(f"127.0.0.1:{front.port}", tls=tls(pki), timeout=5) as client:
        with pytest.raises(Unavailable) as err:
            client.begin()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert len(front.seen) == before


def test_a_client_certificate_needs_its_key(pki):
    with pytest.raises(ValueError, match="cert= and key="):
        TLS(ca=pki.ca, cert=pki.client_cert)


# ---- what is retried -----------------------------------------------------------------------

@pytest.fixture
def plain_front(replicas):
    f = Front(replicas[0].target)
    yield f
    f.close()


def test_reads_are_retried_while_the_service_is_unavailable(plain_front, uniq):
    with Client(f"127.0.0.1:{plain_front.port}") as client:
        tx = client.begin()
        plain_front.fail["GetTransaction"] = 2
        assert client.get(tx.id).next_step_id == 1
        assert plain_front.calls("GetTransaction") == 3  # two UNAVAILABLE, then the answer
        plain_front.fail["ListTransactions"] = 1
        assert [t.transaction_id for t in client.list_transactions(agent_id_prefix="")
                if t.transaction_id == tx.id] == [tx.id]
        assert plain_front.calls("ListTransactions") >= 2
        tx.rollback()


def test_a_lost_step_the_reread_clears_is_resent_once(plain_front, uniq):
    with Client(f"127.0.0.1:{plain_front.port}") as client:
        tx = client.begin()
        plain_front.fail["ExecuteStep"] = 1  # refused before it reached the replica
        r = tx.step("kv.put", {"key": f"resend-{uniq}", "value": 1})
        assert (r.ok, r.step_id, r.next_step_id) == (True, 1, 2)
        assert plain_front.calls("ExecuteStep") == 2 and client.resent_steps == 1
        assert client.get(tx.id).next_step_id == 2  # applied once
        tx.commit()


def test_a_lost_step_that_applied_is_not_resent(plain_front, uniq):
    with Client(f"127.0.0.1:{plain_front.port}") as client:
        tx = client.begin()
        plain_front.lose["ExecuteStep"] = 1  # applied, then the answer was lost
        with pytest.raises(OutcomeUnknown) as err:
            tx.step("kv.put", {"key": f"applied-{uniq}", "value": 1})
        assert plain_front.calls("ExecuteStep") == 1 and client.resent_steps == 0
        assert "the re-read shows next_step_id 2: the step applied" in err.value.details
        assert "it was not retried" in err.value.details
        assert tx.next_step_id == 2
        tx.rollback()


def test_a_lost_failure_with_a_new_hint_is_not_resent(plain_front, uniq):
    with Client(f"127.0.0.1:{plain_front.port}") as client:
        tx = client.begin()
        plain_front.lose["ExecuteStep"] = 1  # it failed (LOCAL_BACKTRACK): next step unchanged
        with pytest.raises(OutcomeUnknown) as err:
            tx.step("kv.get", {"key": f"missing-{uniq}"})
        assert plain_front.calls("ExecuteStep") == 1 and client.resent_steps == 0
        state = err.value.state
        assert state is not None and state.next_step_id == 1
        assert [c for c in state.constraints if f"missing-{uniq}" in c]  # the lost hint, re-read
        tx.rollback()


def test_resending_can_be_turned_off(plain_front, uniq):
    with Client(f"127.0.0.1:{plain_front.port}", resend_lost_steps=False) as client:
        tx = client.begin()
        plain_front.fail["ExecuteStep"] = 1
        with pytest.raises(OutcomeUnknown) as step:
            tx.step("kv.put", {"key": f"once-{uniq}", "value": 1})
        assert plain_front.calls("ExecuteStep") == 1
        assert step.value.code == grpc.StatusCode.UNAVAILABLE
        assert step.value.state is not None and step.value.state.next_step_id == 1
        assert "the step did not apply" in step.value.details  # the front never forwarded it
        assert tx.step("kv.put", {"key": f"once-{uniq}", "value": 1}).step_id == 1
        tx.rollback()


async def test_the_async_client_resends_a_cleared_step_too(plain_front, uniq):
    async with AsyncClient(f"127.0.0.1:{plain_front.port}") as client:
        tx = await client.begin()
        plain_front.fail["ExecuteStep"] = 1
        r = await tx.step("kv.put", {"key": f"aresend-{uniq}", "value": 1})
        assert (r.ok, r.next_step_id, client.resent_steps) == (True, 2, 1)
        assert plain_front.calls("ExecuteStep") == 2
        plain_front.lose["ExecuteStep"] = 1
        with pytest.raises(OutcomeUnknown) as err:
            await tx.step("kv.put", {"key": f"aresend2-{uniq}", "value": 2})
        assert "the step applied" in err.value.details and client.resent_steps == 1
        await tx.rollback()


def test_commits_and_rollbacks_are_never_retried(plain_front, uniq):
    with Client(f"127.0.0.1:{plain_front.port}") as client:
        tx = client.begin()
        assert tx.step("kv.put", {"key": f"once-{uniq}", "value": 1}).step_id == 1

        plain_front.fail["CommitTransaction"] = 1
        with pytest.raises(OutcomeUnknown) as commit:
            tx.commit()
        assert plain_front.calls("CommitTransaction") == 1
        assert commit.value.state is not None and not commit.value.ended
        assert "still open (ACTIVE, next_step_id 2)" in commit.value.details
        assert not tx.finished

        plain_front.fail["RollbackTransaction"] = 1
        with pytest.raises(OutcomeUnknown):
            tx.rollback()
        assert plain_front.calls("RollbackTransaction") == 1
        plain_front.fail["BeginTransaction"] = 1
        with pytest.raises(Unavailable):
            client.begin()
        assert plain_front.calls("BeginTransaction") == 2  # the first begin, then this one
        assert tx.rollback().rolled_back
