"""`--auth kubernetes` against a real etcd: the JwksCache follows the operator's document
through its watch, and the mode works end to end over real gRPC (docs/security.md#kubernetes).

The document is written with the project's Store at Keys(prefix).auth_jwks(), exactly
where the operator publishes it. Every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import grpc
import pytest

from agenttx import errors
from agenttx.auth import Authenticator, JwksCache, Principal, ServiceAccountVerifier
from agenttx.config import Settings
from agenttx.contracts.layout import Keys
from agenttx.embedded_etcd import EmbeddedEtcd
from agenttx.store.client import Store, connect
from integration.test_auth_grpc import echo_server, refused, whoami
from support.certs import K8S_ISSUER, ServiceAccountIssuer, jwks_document
from support.waiting import eventually_async, slack

ETCD_TIMEOUT_S = 2.0   # the store's timeout in the outage test
TIMEOUT_S = slack(1.0)  # a watch event reaches the cache at once on a quiet machine
# after etcd restarted: a call or the watch first times out on the old connection
RESTART_S = slack(2 * ETCD_TIMEOUT_S)
BILLING = Principal("system:serviceaccount:team-a:billing-agent", "team-a", frozenset())


async def until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT_S) -> None:
    async def check() -> bool:
        return condition()
    await eventually_async(check, timeout, what, interval=0.02)


def kids(cache: JwksCache) -> set[str | None] | None:
    return None if cache.current is None else set(cache.current.keys)


def outcome(verifier: ServiceAccountVerifier, token: str) -> str:
    try:
        return verifier.verify(token).name
    except errors.Unauthenticated as exc:
        return str(exc)


@pytest.fixture(scope="module")
def k1() -> ServiceAccountIssuer:
    return ServiceAccountIssuer(alg="RS256", kid="k1")


@pytest.fixture(scope="module")
def k2() -> ServiceAccountIssuer:
    return ServiceAccountIssuer(alg="ES256", kid="k2")


async def test_cache_follows_key_rotation_through_the_watch(
        store: Store, etcd_prefix: str, k1: ServiceAccountIssuer, k2: ServiceAccountIssuer) -> None:
    keys = Keys(etcd_prefix)
    await store.put(keys.auth_jwks(), jwks_document(K8S_ISSUER, k1))
    cache = JwksCache(store, keys)
    verifier = ServiceAccountVerifier(cache.snapshot)
    await cache.load()
    cache.start()
    try:
        assert kids(cache) == {"k1"} and cache.current is not None
        assert cache.current.issuer == K8S_ISSUER
        t1, t2 = k1.mint("team-a", "billing-agent"), k2.mint("team-a", "billing-agent")
        assert verifier.verify(t1) == BILLING
        assert outcome(verifier, t2) == "invalid credentials"

        # Rotation as the API server does it: the new key joins, then the old one leaves.
        await store.put(keys.auth_jwks(), jwks_document(K8S_ISSUER, k1, k2))
        await until(lambda: kids(cache) == {"k1", "k2"}, "the new key is published")
        assert verifier.verify(t1) == BILLING and verifier.verify(t2) == BILLING
        await store.put(keys.auth_jwks(), jwks_document(K8S_ISSUER, k2))
        await until(lambda: kids(cache) == {"k2"}, "the old key is withdrawn")
        assert outcome(verifier, t1) == "invalid credentials"
        assert verifier.verify(t2) == BILLING

        # A malformed document keeps the previous keys.
        rev = await store.put(keys.auth_jwks(), b'{"issuer": "x", "jwks": {"keys": "oops"}}')
        await until(lambda: cache.revision >= rev, "the malformed document is seen")
        assert kids(cache) == {"k2"} and verifier.verify(t2) == BILLING

        # An issuer change is followed too.
        await store.put(keys.auth_jwks(), jwks_document("https://oidc.example/c1", k2))
        await until(lambda: cache.current is not None
                    and cache.current.issuer == "https://oidc.example/c1", "the issuer changes")
        assert outcome(verifier, t2) == "invalid credentials"
        assert verifier.verify(k2.mint(issuer="https://oidc.example/c1")) == BILLING

        # Deleting the document withdraws every key.
        await store.delete(keys.auth_jwks())
        await until(lambda: kids(cache) == set(), "the document is deleted")
        assert outcome(verifier, t2) == "invalid credentials"
    finally:
        await cache.stop()


async def test_cache_started_before_the_operator_published(
        store: Store, etcd_prefix: str, k1: ServiceAccountIssuer) -> None:
    keys = Keys(etcd_prefix)
    cache = JwksCache(store, keys)
    verifier = ServiceAccountVerifier(cache.snapshot)
    assert outcome_or_unavailable(verifier, k1.mint()) == "unavailable"  # not loaded yet
    cache.start()
    try:
        await until(cache.ready.is_set, "the first load")
        assert outcome(verifier, k1.mint()) == "invalid credentials"
        await store.put(keys.auth_jwks(), jwks_document(K8S_ISSUER, k1))
        await until(lambda: kids(cache) == {"k1"}, "the operator publishes")
        assert verifier.verify(k1.mint()) == BILLING
    finally:
        await cache.stop()


def outcome_or_unavailable(verifier: ServiceAccountVerifier, token: str) -> str:
    try:
        return outcome(verifier, token)
    except errors.StoreUnavailable:
        return "unavailable"


@pytest.mark.timeout(120)
async def test_watch_recovers_after_an_etcd_restart(scratch, k1: ServiceAccountIssuer,
                                                    k2: ServiceAccountIssuer) -> None:
    own = EmbeddedEtcd(scratch / f"etcd-jwks-{uuid.uuid4().hex[:6]}")
    await asyncio.to_thread(own.start)
    store = connect(own.endpoints, timeout=ETCD_TIMEOUT_S)
    keys = Keys("/agenttx-jwks")
    cache = JwksCache(store, keys)
    try:
        await store.put(keys.auth_jwks(), jwks_document(K8S_ISSUER, k1))
        await cache.load()
        cache.start()
        await asyncio.to_thread(own.kill, 0)
        await asyncio.to_thread(own.restart, 0)
        # The keys in force survive the outage ...
        assert kids(cache) == {"k1"}
        # ... and a rotation published after it still reaches the cache.
        async def published() -> bool:
            await store.put(keys.auth_jwks(), jwks_document(K8S_ISSUER, k2))
            return True
        await eventually_async(published, RESTART_S, "etcd takes writes again",
                               retry_on=(errors.StoreUnavailable,))
        await until(lambda: kids(cache) == {"k2"}, "the cache follows after the restart",
                    RESTART_S)
    finally:
        await cache.stop()
        await store.close()
        await asyncio.to_thread(own.stop)


async def test_kubernetes_mode_over_grpc(store: Store, etcd_prefix: str,
                                         k1: ServiceAccountIssuer) -> None:
    await store.put(Keys(etcd_prefix).auth_jwks(), jwks_document(K8S_ISSUER, k1))
    settings = Settings(auth="kubernetes", etcd_prefix=etcd_prefix)
    auth = Authenticator.from_settings(settings, store=store)
    async with echo_server(None, auth) as address:
        def bearer(token: str) -> tuple[tuple[str, str], ...]:
            return (("authorization", f"Bearer {token}"),)

        assert await whoami(address, None, bearer(k1.mint("team-a", "billing-agent"))) == {
            "name": "system:serviceaccount:team-a:billing-agent", "namespace": "team-a",
            "roles": []}
        code = grpc.StatusCode.UNAUTHENTICATED
        await refused(whoami(address, None), code, "missing credentials")
        await refused(whoami(address, None, bearer(k1.mint(issued_ago_s=7200, lifetime_s=3600))),
                      code, "expired credentials")
        await refused(whoami(address, None, bearer(k1.mint(audience="https://kubernetes.default.svc"))),
                      code, "invalid credentials")
        await refused(whoami(address, None, bearer("not.a.jwt")), code, "invalid credentials")
