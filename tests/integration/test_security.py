"""SPEC §9 against real `agenttx serve` replicas and a real etcd: TLS and mTLS with
certificates generated here, token files (and their rotation), ServiceAccount JWTs
verified against keys published in etcd, ownership, namespace-scoped policies and
sandboxes, and per-principal quotas."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from agenttx.auth import hash_token
from agenttx.client import (
    TLS,
    AgentTxError,
    Client,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
)
from agenttx.contracts.layout import Keys
from agenttx.contracts.policy import PublishedPolicy, policy_to_json
from agenttx.store.client import connect
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from support.certs import (
    CertificateAuthority,
    ServiceAccountIssuer,
    jwks_document,
    spiffe_id,
    write_atomically,
)
from support.service import ServiceProcess

UNAUTH = grpc.StatusCode.UNAUTHENTICATED


def tokens_file(path: pathlib.Path, entries: dict[str, tuple[str, str, list[str]]]) -> None:
    """token -> (principal, namespace, roles), written as the hashes-only file."""
    doc = {"tokens": [{"sha256": hash_token(t), "principal": p, "namespace": ns, "roles": r}
                      for t, (p, ns, r) in entries.items()]}
    write_atomically(path, json.dumps(doc))


def raw(service: ServiceProcess, method: str, request, token: str | None = None):
    """Call one RPC through a bare stub (to check codes without the client's help)."""
    md = (("authorization", f"Bearer {token}"),) if token else ()
    return getattr(service.stub, method)(request, metadata=md, timeout=10)


def code_of(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def pki(scratch: pathlib.Path) -> dict[str, object]:
    ca = CertificateAuthority("AgentTx service CA")
    folder = scratch / f"pki-{uuid.uuid4().hex[:6]}"
    cert, key = ca.server().write(folder, "server")
    return {"ca": ca, "ca_file": ca.write(folder), "cert": cert, "key": key, "dir": folder}


# ---- token mode over TLS ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def token_replicas(etcd, scratch, sandbox, pki) -> Iterator[tuple[ServiceProcess, ...]]:
    path = scratch / f"tokens-{uuid.uuid4().hex[:6]}.json"
    tokens_file(path, {"alice-t0ken": ("alice", "team-a", ["agent"]),
                       "bob-t0ken": ("bob", "team-b", ["agent"]),
                       "root-t0ken": ("ops", "agenttx-system", ["admin"])})
    prefix = f"/agenttx-tok-{uuid.uuid4().hex[:6]}"
    procs = tuple(ServiceProcess(
        f"tok-{i}", etcd_endpoints=etcd.endpoints, prefix=prefix, fs_root=str(sandbox),
        workdir=scratch / "tok", tls=TLS(ca=str(pki["ca_file"])),
        extra_args=["--auth", "token", "--auth-tokens-file", str(path),
                    "--tls-cert-file", str(pki["cert"]), "--tls-key-file", str(pki["key"])]
    ).start() for i in range(2))
    procs[0].tokens_path = path  # type: ignore[attr-defined]
    yield procs
    for p in procs:
        p.stop()


def test_no_credentials_is_unauthenticated_and_says_only_missing(token_replicas):
    a, _ = token_replicas
    for method, req in (("BeginTransaction", pb.BeginTransactionRequest()),
                        ("GetTransaction", pb.GetTransactionRequest(transaction_id=str(uuid.uuid4())))):
        with pytest.raises(grpc.RpcError) as err:
            raw(a, method, req)
        assert (err.value.code(), err.value.details()) == (UNAUTH, "missing credentials")
        with pytest.raises(grpc.RpcError) as err:
            raw(a, method, req, token="not-a-token")
        assert (err.value.code(), err.value.details()) == (UNAUTH, "invalid credentials")
    assert a.health() == "SERVING"  # probes need no credentials


def test_another_principals_transaction_does_not_exist_for_them_on_any_rpc(token_replicas, uniq):
    a, b = token_replicas
    with a.client(token="alice-t0ken") as alice, b.client(token="bob-t0ken") as bob:
        tx = alice.begin(agent_id=f"alice-{uniq}")
        tx.step("kv.put", {"key": f"secret-{uniq}", "value": 1}, context="alice's notes")
        unknown = str(uuid.uuid4())
        answers = [_answers_to(b, target, uniq) for target in (tx.id, unknown)]
        assert {v for k, v in answers[0].items() if " " not in k} == {grpc.StatusCode.NOT_FOUND}
        assert answers[0] == answers[1]  # word for word what an unknown id gets
        # bob lists his own transactions only: alice's is not among them
        mine = bob.begin(agent_id=f"bob-{uniq}")
        assert {t.transaction_id for t in bob.list_transactions()} == {mine.id}
        mine.rollback()
        # still alive and untouched for its owner
        view = alice.get(tx.id)
        assert (view.next_step_id, [c.raw_context for c in view.context]) == (2, ["alice's notes"])
        tx.rollback()


def _answers_to(b: ServiceProcess, target: str, uniq: str) -> dict[str, object]:
    """What bob gets from every RPC on `target`: (code, details with the id blanked)."""
    calls = {
        "ExecuteStep": ("ExecuteStep", pb.ExecuteStepRequest(
            transaction_id=target, step_id=2, tool_name="kv.get",
            arguments_json=json.dumps({"key": f"secret-{uniq}"}))),
        "CommitTransaction": ("CommitTransaction",
                              pb.CommitTransactionRequest(transaction_id=target)),
        "RollbackTransaction": ("RollbackTransaction",
                                pb.RollbackTransactionRequest(transaction_id=target)),
        "GetTransaction": ("GetTransaction", pb.GetTransactionRequest(transaction_id=target)),
        "GetTransactionHistory": ("GetTransactionHistory",
                                  pb.GetTransactionHistoryRequest(transaction_id=target)),
    }
    out: dict[str, object] = {}
    for name, (method, req) in calls.items():
        try:
            raw(b, method, req, "bob-t0ken")
            out[name] = "answered"
        except grpc.RpcError as err:
            out[name] = err.code()
            out[name + " details"] = (err.details() or "").replace(target, "<id>")
    return out


def test_an_admin_may_get_and_roll_back_anyones_transaction_but_not_step_it(token_replicas, uniq):
    a, b = token_replicas
    with a.client(token="alice-t0ken") as alice, b.client(token="root-t0ken") as ops:
        tx = alice.begin(agent_id=f"alice-{uniq}")
        tx.step("kv.put", {"key": f"k-{uniq}", "value": 1})
        view = ops.get(tx.id)
        assert (view.principal, view.agent_id, view.next_step_id) == ("alice", f"alice-{uniq}", 2)
        assert tx.id in {t.transaction_id for t in ops.list_transactions(agent_id_prefix="alice-")}
        assert code_of(lambda: raw(b, "ExecuteStep", pb.ExecuteStepRequest(
            transaction_id=tx.id, step_id=2, tool_name="kv.put",
            arguments_json='{"key": "x"}'), "root-t0ken")) == grpc.StatusCode.NOT_FOUND
        assert code_of(lambda: raw(b, "CommitTransaction", pb.CommitTransactionRequest(
            transaction_id=tx.id), "root-t0ken")) == grpc.StatusCode.NOT_FOUND
        assert ops.history(tx.id).steps[0].tool == "kv.put"  # an admin reads any history
        result = ops.rollback(tx.id, reason="resolved by ops")
        assert result.rolled_back
        with pytest.raises(NotFound):
            alice.get(tx.id)
        # the owner learns who ended it, and why
        ended = alice.history(tx.id)
        assert (ended.status.value, ended.principal, ended.ended_by, ended.reason) == \
            ("ABORTED", "alice", "ops", "resolved by ops")


def test_the_tx_cli_exits_4_for_a_refused_credential(token_replicas, pki):
    a, _ = token_replicas
    run = subprocess.run([sys.executable, "-m", "agenttx", "tx", "list", "--target", a.address,
                          "--tls-ca", str(pki["ca_file"]), "--token", "not-a-token"],
                         capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == (
        4, "", "agenttx tx list: UNAUTHENTICATED: invalid credentials\n")


def test_a_plaintext_client_is_refused_by_a_tls_only_server(token_replicas):
    a, _ = token_replicas
    with grpc.insecure_channel(a.address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.AgentTxServiceStub(ch).BeginTransaction(
                pb.BeginTransactionRequest(), metadata=(("authorization", "Bearer alice-t0ken"),),
                timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_idempotency_keys_are_unique_per_principal(token_replicas, uniq):
    a, b = token_replicas
    key = f"shared-{uniq}"
    with a.client(token="alice-t0ken") as alice, b.client(token="bob-t0ken") as bob:
        ta, tb = alice.begin(), bob.begin()
        assert ta.step("effect.stage", {"channel": "log", "idempotency_key": key}).ok
        assert tb.step("effect.stage", {"channel": "log", "idempotency_key": key}).ok
        again = alice.begin()
        dup = again.step("effect.stage", {"channel": "log", "idempotency_key": key})
        assert (dup.ok, dup.category) == (False, "unique_violation")
        for t in (ta, tb, again):
            t.rollback()


def test_a_rotated_tokens_file_applies_without_a_restart(token_replicas):
    a, _ = token_replicas
    path = a.tokens_path  # type: ignore[attr-defined]
    before = json.loads(path.read_text())
    tokens_file(path, {"carol-t0ken": ("carol", "team-c", ["agent"]),
                       "bob-t0ken": ("bob", "team-b", ["agent"]),
                       "root-t0ken": ("ops", "agenttx-system", ["admin"])})
    try:
        deadline = time.monotonic() + 20
        while code_of(lambda: raw(a, "BeginTransaction", pb.BeginTransactionRequest(),
                                  "carol-t0ken")) != grpc.StatusCode.OK:
            assert time.monotonic() < deadline, "the new token never took effect"
            time.sleep(0.2)
        with pytest.raises(grpc.RpcError) as err:
            raw(a, "BeginTransaction", pb.BeginTransactionRequest(), "alice-t0ken")
        assert (err.value.code(), err.value.details()) == (UNAUTH, "invalid credentials")
    finally:
        write_atomically(path, json.dumps(before))
        deadline = time.monotonic() + 20
        while code_of(lambda: raw(a, "BeginTransaction", pb.BeginTransactionRequest(),
                                  "alice-t0ken")) != grpc.StatusCode.OK:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_no_token_appears_in_logs(token_replicas):
    text = "".join(p.log_path.read_text() for p in token_replicas)
    for secret in ("alice-t0ken", "bob-t0ken", "root-t0ken", "not-a-token"):
        assert secret not in text
    assert '"principal": "alice"' in text and '"audit": true' in text


# ---- quotas -----------------------------------------------------------------------------------

def test_quotas_exhaust_per_principal_and_leave_others_alone(etcd, scratch, sandbox, uniq):
    path = scratch / f"quota-tokens-{uniq}.json"
    tokens_file(path, {"greedy": ("greedy", "team-a", ["agent"]),
                       "polite": ("polite", "team-b", ["agent"])})
    svc = ServiceProcess(f"quota-{uniq}", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-quota-{uniq}", fs_root=str(sandbox),
                         workdir=scratch / "quota",
                         extra_args=["--auth", "token", "--auth-tokens-file", str(path),
                                     "--max-open-transactions", "2",
                                     "--max-requests-per-s", "5"]).start()
    try:
        with svc.client(token="greedy") as greedy, svc.client(token="polite") as polite:
            held = [greedy.begin(), greedy.begin()]
            with pytest.raises(ResourceExhausted) as err:
                greedy.begin()
            assert "max-open-transactions (2)" in err.value.details
            assert polite.begin().id  # another principal is unaffected
            held[0].commit()
            time.sleep(0.5)  # the rate bucket refills (5/s)
            held.append(greedy.begin())  # a slot was freed
            refused = 0
            for _ in range(30):
                try:
                    greedy.get(held[1].id)
                except ResourceExhausted as exc:
                    assert "max-requests-per-s (5)" in exc.details
                    refused += 1
            assert refused > 0
            assert polite.begin().id
    finally:
        svc.stop()


# ---- kubernetes mode: two replicas, keys in etcd ------------------------------------------------

ISSUER = "https://kubernetes.default.svc.cluster.local"


@pytest.fixture(scope="module")
def k8s(etcd, scratch, sandbox) -> Iterator[dict[str, object]]:
    prefix = f"/agenttx-k8s-{uuid.uuid4().hex[:6]}"
    keys = Keys(prefix)
    signer = ServiceAccountIssuer(ISSUER)
    roots = {ns: scratch / f"sandboxes-{uuid.uuid4().hex[:6]}" / ns / "policy"
             for ns in ("team-a", "team-b")}
    for ns, root in roots.items():
        root.mkdir(parents=True)
        (root / "secret.txt").write_text(f"{ns}'s secret")

    async def publish() -> None:
        store = connect(etcd.endpoints)
        try:
            await store.put(keys.auth_jwks(), jwks_document(ISSUER, signer))
            for ns, root in roots.items():
                policy = PublishedPolicy(namespace=ns, name="policy", generation=1, priority=10,
                                         agent_id_prefix=f"{ns}-", max_local_depth=0,
                                         sandbox_path=str(root))
                await store.put(keys.policy(ns, "policy"), policy_to_json(policy))
        finally:
            await store.close()

    asyncio.run(publish())
    procs = [ServiceProcess(f"k8s-{i}", etcd_endpoints=etcd.endpoints, prefix=prefix,
                            fs_root=str(sandbox), workdir=scratch / "k8s",
                            extra_args=["--auth", "kubernetes",
                                        "--service-namespace", "agenttx-system",
                                        "--auth-admins", "system:serviceaccount:agenttx-system:ops"]
                            ).start() for i in range(2)]
    yield {"replicas": procs, "signer": signer, "roots": roots}
    for p in procs:
        p.stop()


def test_service_account_tokens_are_verified_offline(k8s):
    a, b = k8s["replicas"]
    signer: ServiceAccountIssuer = k8s["signer"]
    good = signer.mint("team-a", "billing-agent")
    for replica in (a, b):
        with replica.client(token=good) as client:
            tx = client.begin(agent_id="anything")
            assert client.get(tx.id).principal == "system:serviceaccount:team-a:billing-agent"
            tx.rollback()
    refused = {
        "expired": (signer.mint(issued_ago_s=7200, lifetime_s=3600), "expired credentials"),
        "wrong audience": (signer.mint(audience="vault"), "invalid credentials"),
        "wrong issuer": (signer.mint(issuer="https://evil.example"), "invalid credentials"),
        "other key": (ServiceAccountIssuer(ISSUER, kid=signer.kid).mint(), "invalid credentials"),
    }
    for case, (token, message) in refused.items():
        with pytest.raises(grpc.RpcError) as err:
            raw(b, "BeginTransaction", pb.BeginTransactionRequest(), token)
        assert (err.value.code(), err.value.details()) == (UNAUTH, message), case


def test_a_principal_never_gets_another_namespaces_policy_or_sandbox(k8s, uniq):
    a, b = k8s["replicas"]
    signer: ServiceAccountIssuer = k8s["signer"]
    with a.client(token=signer.mint("team-a", "spy")) as spy, \
            b.client(token=signer.mint("team-b", "owner")) as owner:
        own = owner.begin(agent_id=f"team-b-{uniq}")
        assert own.step("fs.read", {"path": "secret.txt"}).output["contents"] == "team-b's secret"
        own.rollback()
        stolen = spy.begin(agent_id=f"team-b-{uniq}")  # team B's selector, team A's principal
        read = stolen.step("fs.read", {"path": "secret.txt"})
        assert (read.ok, read.category) == (False, "undefined_file")
        # and team B's policy (max_local_depth 0) does not apply either: a local retry
        assert read.strategy.value == "LOCAL_BACKTRACK"
        stolen.rollback()
        mine = spy.begin(agent_id=f"team-a-{uniq}")
        assert mine.step("fs.read", {"path": "secret.txt"}).output["contents"] == "team-a's secret"
        mine.rollback()


def test_an_admin_from_the_settings_may_list_get_and_roll_back(k8s, uniq):
    a, b = k8s["replicas"]
    signer: ServiceAccountIssuer = k8s["signer"]
    with a.client(token=signer.mint("team-a", "worker")) as worker, \
            b.client(token=signer.mint("agenttx-system", "ops")) as ops:
        tx = worker.begin(agent_id=f"w-{uniq}")
        # a non-admin lists its own transactions only; the admin sees everyone's
        assert {t.principal for t in worker.list_transactions()} == \
            {"system:serviceaccount:team-a:worker"}
        assert [t.principal for t in ops.list_transactions(agent_id_prefix=f"w-{uniq}")] == \
            ["system:serviceaccount:team-a:worker"]
        assert ops.rollback(tx.id).rolled_back


# ---- mTLS -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mtls(etcd, scratch, sandbox, pki) -> Iterator[ServiceProcess]:
    ca: CertificateAuthority = pki["ca"]  # type: ignore[assignment]
    folder: pathlib.Path = pki["dir"]  # type: ignore[assignment]
    cert, key = ca.client(uris=[spiffe_id("team-a", "probe")]).write(folder, "probe")
    svc = ServiceProcess("mtls", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-mtls-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                         workdir=scratch / "mtls",
                         tls=TLS(ca=str(pki["ca_file"]), cert=str(cert), key=str(key)),
                         extra_args=["--auth", "mtls", "--tls-cert-file", str(pki["cert"]),
                                     "--tls-key-file", str(pki["key"]),
                                     "--tls-client-ca-file", str(pki["ca_file"])]).start()
    yield svc
    svc.stop()


def test_mtls_takes_the_principal_from_the_client_certificate(mtls, pki):
    ca: CertificateAuthority = pki["ca"]  # type: ignore[assignment]
    folder: pathlib.Path = pki["dir"]  # type: ignore[assignment]
    cert, key = ca.client(uris=[spiffe_id("team-a", "billing")]).write(folder, "billing")
    with Client(mtls.address, tls=TLS(ca=str(pki["ca_file"]), cert=str(cert), key=str(key))) as c:
        tx = c.begin(agent_id="a")
        assert c.get(tx.id).principal == spiffe_id("team-a", "billing")
        tx.rollback()


def test_mtls_without_a_client_certificate_is_refused(mtls, pki):
    with Client(mtls.address, tls=TLS(ca=str(pki["ca_file"]))) as anonymous:
        with pytest.raises(AgentTxError) as err:
            anonymous.begin()
        assert err.value.code in (grpc.StatusCode.UNAVAILABLE, UNAUTH)
    with Client(mtls.address, tls=TLS(ca=str(pki["ca_file"]))) as again:
        with pytest.raises((AgentTxError, Unauthenticated)):
            again.get(str(uuid.uuid4()))


def test_a_rotated_server_certificate_is_served_without_a_restart(etcd, scratch, sandbox):
    folder = scratch / f"rotate-{uuid.uuid4().hex[:6]}"
    old_ca, new_ca = CertificateAuthority("old CA"), CertificateAuthority("new CA")
    old_ca_file, new_ca_file = old_ca.write(folder, "old-ca"), new_ca.write(folder, "new-ca")
    cert, key = old_ca.server().write(folder, "tls")
    svc = ServiceProcess("rotate", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-rot-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                         workdir=scratch / "rotate", tls=TLS(ca=str(old_ca_file)),
                         extra_args=["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
                         ).start()

    def works(ca_file: pathlib.Path) -> bool:
        try:
            with Client(svc.address, tls=TLS(ca=str(ca_file)), timeout=5) as c:
                c.begin().rollback()
            return True
        except AgentTxError:
            return False

    try:
        assert works(old_ca_file) and not works(new_ca_file)
        issued = new_ca.server()
        write_atomically(key, issued.key_pem)   # a rotation: key first, then the chain
        write_atomically(cert, issued.cert_pem)
        deadline = time.monotonic() + 20
        while not works(new_ca_file):
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.2)
        assert not works(old_ca_file)
    finally:
        svc.stop()
