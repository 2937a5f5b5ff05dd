"""The operator publishes the cluster's service-account issuer keys for the service's
`--auth kubernetes` (docs/security.md#kubernetes): real kopf in its own thread (`main.operate`), kmock as
the API server (serving the issuer discovery's non-resource URLs), a real etcd."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from operator_kmock import (
    SERVICE_NS,
    ApiServer,
    Issuer,
    create,
    eventually,
    policy,
    public_jwk,
    reason_is,
    running_operator,
)

from agenttx.contracts.layout import Keys
from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.errors import StoreUnavailable
from agenttx.store.client import Store
from agenttx_operator import jwks, main

pytestmark = pytest.mark.kmock(cls=ApiServer)

WARNING = "cannot refresh the service-account issuer keys"


async def published_jwks(store: Store, prefix: str) -> tuple[dict[str, Any], int] | None:
    try:
        kv = await store.get(Keys(prefix).auth_jwks())
    except StoreUnavailable:  # an etcd that just started may refuse the first call
        return None
    return (json.loads(kv.value), kv.mod_revision) if kv else None


def kids(doc: dict[str, Any]) -> list[str]:
    return [k["kid"] for k in doc["jwks"]["keys"]]


async def test_operator_publishes_the_issuer_keys_and_follows_a_rotation(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    k1, k2 = public_jwk("k1"), public_jwk("k2")
    issuer = Issuer(api, [k1])
    async with running_operator(make_config(jwks_refresh_s=0.2), api, token="op-t0ken"):
        doc, rev = await eventually(lambda: published_jwks(store, etcd_prefix),
                                    what="issuer keys published")
        assert doc == {"issuer": Issuer.ISSUER, "jwks": {"keys": [k1]}}
        kv = await store.get(Keys(etcd_prefix).auth_jwks())
        assert kv.key == f"{etcd_prefix}/auth/jwks".encode()
        assert kv.value == jwks.encode(doc)

        # Unchanged keys are never rewritten (the service's watchers see no event).
        seen = issuer.requests(jwks.JWKS_PATH)
        await eventually(lambda: issuer.requests(jwks.JWKS_PATH) >= seen + 2,
                         what="two more refreshes")
        assert await published_jwks(store, etcd_prefix) == (doc, rev)

        # Key rotation: the API server serves the new key next to the old one, later
        # the new key alone.
        issuer.keys = [k1, k2]

        async def has(want: list[str]) -> bool:
            now = await published_jwks(store, etcd_prefix)
            return now is not None and kids(now[0]) == want
        await eventually(lambda: has(["k1", "k2"]), what="rotated keys published")
        issuer.keys = [k2]
        await eventually(lambda: has(["k2"]), what="old key retired")

    # The operator's own credentials, the API server's own route, the accepted media type.
    paths = {r.url.path for r in list(api) if r.url.path.startswith(("/.well-known", "/openid"))}
    assert paths == {"/.well-known/openid-configuration", "/openid/v1/jwks"}
    for r in list(api):
        if r.url.path in paths:
            assert r.headers.get("Authorization") == "Bearer op-t0ken"
        if r.url.path == "/openid/v1/jwks":
            assert "application/jwk-set+json" in r.headers.get("Accept", "")


async def test_failing_discovery_or_garbage_keeps_the_published_keys(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agenttx_operator")
    k1, k2 = public_jwk("k1"), public_jwk("k2")
    issuer = Issuer(api, [k1])
    async with running_operator(make_config(jwks_refresh_s=0.2), api):
        good = await eventually(lambda: published_jwks(store, etcd_prefix),
                                what="issuer keys published")

        # The API server hiccups: discovery answers 503 while the keys rotate. Rotate
        # only once a refresh has started after the failure (refreshes run one at a
        # time), so no refresh that passed discovery earlier can fetch the new keys.
        seen = issuer.requests(jwks.DISCOVERY_PATH)
        issuer.failure = 503
        await eventually(lambda: issuer.requests(jwks.DISCOVERY_PATH) > seen,
                         what="a refresh after the failure began")
        issuer.keys = [k2]
        seen = issuer.requests(jwks.DISCOVERY_PATH)
        await eventually(lambda: issuer.requests(jwks.DISCOVERY_PATH) >= seen + 2,
                         what="failed refreshes")
        warnings = await eventually(
            lambda: [r for r in caplog.records if r.getMessage().startswith(WARNING)],
            what="warning logged")
        assert await published_jwks(store, etcd_prefix) == good
        record = warnings[0]
        assert record.levelno == logging.WARNING
        assert record.jwks_error_type == "KubeError"  # type: ignore[attr-defined]
        assert record.jwks_error == (  # type: ignore[attr-defined]
            "GET /.well-known/openid-configuration: HTTP 503: etcdserver: request timed out")
        assert record.jwks_key == f"{etcd_prefix}/auth/jwks"  # type: ignore[attr-defined]
        assert record.jwks_retry_in_s == 0.2  # type: ignore[attr-defined]

        # It answers again, but with an empty key set: never published.
        issuer.keyset = {"keys": []}
        issuer.failure = None
        seen = issuer.requests(jwks.JWKS_PATH)
        await eventually(lambda: issuer.requests(jwks.JWKS_PATH) >= seen + 2,
                         what="refreshes of an empty key set")
        await eventually(lambda: "the key set has no keys: []" in caplog.text,
                         what="validation warning")
        assert await published_jwks(store, etcd_prefix) == good

        # Healthy again: the rotated key goes out.
        issuer.keyset = None
        doc, _ = await eventually(
            lambda: _changed(store, etcd_prefix, good[1]), what="rotated keys published")
        assert kids(doc) == ["k2"]


async def _changed(store: Store, prefix: str, rev: int) -> tuple[dict[str, Any], int] | None:
    now = await published_jwks(store, prefix)
    return now if now is not None and now[1] != rev else None


async def test_issuer_keys_are_published_once_etcd_is_reachable(
    api: ApiServer, make_config, scratch, etcd_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agenttx_operator")
    issuer = Issuer(api, [public_jwk("k1")])
    port = free_port()
    config = make_config(etcd_endpoints=[f"127.0.0.1:{port}"], etcd_timeout_s=0.3,
                         jwks_refresh_s=0.2)
    async with running_operator(config, api):
        await eventually(lambda: [r for r in caplog.records if r.getMessage().startswith(WARNING)
                                  and r.jwks_error_type == "StoreUnavailable"],
                         what="etcd failure logged")
        late = EmbeddedEtcd(scratch / f"jwks-{port}", client_ports=[port]).start()
        try:
            from agenttx.store.client import connect
            s = connect([f"127.0.0.1:{port}"])
            try:
                doc, _ = await eventually(lambda: published_jwks(s, etcd_prefix), timeout=20,
                                          what="published after etcd came back")
            finally:
                await s.close()
            assert kids(doc) == ["k1"]
        finally:
            late.stop()
    assert issuer.requests(jwks.DISCOVERY_PATH) >= 2


async def test_publishing_the_issuer_keys_can_be_turned_off(
    api: ApiServer, etcd_endpoint: str, store: Store, etcd_prefix: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agenttx_operator")
    issuer = Issuer(api, [public_jwk("k1")])
    monkeypatch.setenv("AGENTTX_OPERATOR_JWKS_PUBLISH", "false")
    monkeypatch.setenv("AGENTTX_OPERATOR_JWKS_REFRESH_S", "0.2")
    config = main.parse_config([
        "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", etcd_prefix,
        "--service-namespace", SERVICE_NS, "--liveness-host", "127.0.0.1",
        "--liveness-port", str(free_port())])
    assert (config.jwks_publish, config.jwks_refresh_s) == (False, 0.2)
    async with running_operator(config, api):
        await create(api, policy("witness", {}))
        await eventually(reason_is(api, "witness", "Published"), what="operator working")
    assert "not publishing the service-account issuer keys" in caplog.text
    assert issuer.requests(jwks.DISCOVERY_PATH) == 0
    assert await published_jwks(store, etcd_prefix) is None
