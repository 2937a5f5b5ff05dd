"""The Authenticator facade: settings checks, bearer metadata, the three refusal texts."""

from __future__ import annotations

import json
import logging
import pathlib

import grpc
import pytest

from agenttx import errors
from agenttx.api.status import status_for
from agenttx.auth import (
    ANONYMOUS,
    AuthConfigError,
    Authenticator,
    Principal,
    TokenFile,
    bearer_token,
    hash_token,
)
from agenttx.config import Settings
from agenttx.store.client import connect
from support.certs import write_atomically


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def refused(call, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(errors.Unauthenticated) as err:
        call(*args)
    return str(err.value)


def test_bearer_token_from_metadata() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token((("x-trace", "1"), ("authorization", "bEaReR   abc  "))) == "abc"
    assert bearer_token([("Authorization", b"Bearer abc")]) == "abc"
    assert refused(bearer_token, None) == "missing credentials"
    assert refused(bearer_token, [("x-trace", "1")]) == "missing credentials"
    assert refused(bearer_token, [("authorization", "Bearer ")]) == "missing credentials"
    assert refused(bearer_token, [("authorization", "Basic dXNlcjpwYXNz")]) == "invalid credentials"
    assert refused(bearer_token, [("authorization", "abc")]) == "invalid credentials"
    assert refused(bearer_token, [("authorization", "Bearer a b")]) == "invalid credentials"
    assert refused(bearer_token, [("authorization", "Bearer a"),
                                  ("authorization", "Bearer b")]) == "invalid credentials"


def test_settings_checks_are_start_up_errors(tmp_path: pathlib.Path) -> None:
    def build(**kw):  # type: ignore[no-untyped-def]
        return Authenticator.from_settings(Settings(**kw))

    with pytest.raises(AuthConfigError, match="--auth none on --listen 0.0.0.0:50051"):
        build(listen="0.0.0.0:50051")
    assert build(listen="0.0.0.0:50051", allow_unauthenticated=True).mode == "none"
    with pytest.raises(AuthConfigError, match="^--auth token needs --auth-tokens-file$"):
        build(auth="token")
    with pytest.raises(AuthConfigError, match="cannot read it"):
        build(auth="token", auth_tokens_file=str(tmp_path / "absent.yaml"))
    with pytest.raises(AuthConfigError, match="^--auth mtls needs --tls-cert-file, --tls-key-file "
                       "and --tls-client-ca-file"):
        build(auth="mtls", tls_cert_file="c", tls_key_file="k")
    with pytest.raises(AuthConfigError, match="expected one of none, token, kubernetes, mtls"):
        build(auth="ldap")
    with pytest.raises(ValueError, match="needs the etcd store"):
        build(auth="kubernetes")


async def test_kubernetes_settings_checks() -> None:
    store = connect(["127.0.0.1:1"])  # never contacted: building only checks the settings
    with pytest.raises(AuthConfigError, match="^--auth kubernetes needs a non-empty --auth-k8s-audience$"):
        Authenticator.from_settings(Settings(auth="kubernetes", auth_k8s_audience=" "), store=store)
    auth = Authenticator.from_settings(Settings(auth="kubernetes"), store=store)
    assert auth.verifier is not None and auth.verifier.audience == "agenttx"
    assert auth.verifier.issuer_override is None
    await store.close()


async def test_none_mode_is_anonymous() -> None:
    auth = Authenticator.from_settings(Settings())
    await auth.start()
    assert await auth.authenticate([("authorization", "Bearer whatever")], None) is ANONYMOUS
    await auth.stop()


async def test_token_mode_end_to_end_with_rotation(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [
        {"sha256": hash_token("t-1"), "principal": "billing-agent", "namespace": "team-a",
         "roles": ["agent"]}]}))
    clock = Clock()
    auth = Authenticator("token", tokens=TokenFile(path, clock=clock))
    await auth.start()
    assert await auth.authenticate([("authorization", "Bearer t-1")], None) == Principal(
        "billing-agent", "team-a", frozenset({"agent"}))
    with pytest.raises(errors.Unauthenticated, match="^invalid credentials$"):
        await auth.authenticate([("authorization", "Bearer t-2")], None)
    with pytest.raises(errors.Unauthenticated, match="^missing credentials$"):
        await auth.authenticate([], None)

    write_atomically(path, json.dumps({"tokens": [
        {"sha256": hash_token("t-2"), "principal": "billing-agent", "namespace": "team-a"}]}))
    clock.now += 1.0
    assert (await auth.authenticate([("authorization", "Bearer t-2")], None)).name == "billing-agent"
    with pytest.raises(errors.Unauthenticated, match="^invalid credentials$"):
        await auth.authenticate([("authorization", "Bearer t-1")], None)
    await auth.stop()


async def test_token_mode_from_settings(tmp_path: pathlib.Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{sha256: {hash_token('ops-token')}, principal: ops, "
                    "roles: [admin]}\n")
    with caplog.at_level(logging.WARNING, logger="agenttx.auth.authenticator"):
        auth = Authenticator.from_settings(Settings(auth="token", auth_tokens_file=str(path),
                                                    listen="0.0.0.0:50051"))
    assert [r.getMessage() for r in caplog.records] == [
        "bearer tokens will cross the network in plaintext: serve TLS (--tls-cert-file/"
        "--tls-key-file) unless a mesh or proxy terminates TLS in front of this port"]
    principal = await auth.authenticate([("authorization", "Bearer ops-token")], None)
    assert principal.is_admin and principal.namespace is None


async def test_mtls_mode_needs_a_client_certificate() -> None:
    auth = Authenticator("mtls")
    with pytest.raises(errors.Unauthenticated, match="^missing credentials$"):
        await auth.authenticate([("authorization", "Bearer x")], {"transport_security_type": [b"ssl"]})


def test_refusals_map_to_their_status_codes() -> None:
    assert status_for(errors.Unauthenticated("missing credentials")) == grpc.StatusCode.UNAUTHENTICATED
    assert status_for(errors.ResourceExhausted("max-requests-per-s (5) exceeded for this principal")) \
        == grpc.StatusCode.RESOURCE_EXHAUSTED
