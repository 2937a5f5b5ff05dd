"""`--auth kubernetes`: projected ServiceAccount tokens verified offline (SPEC §9).

Why offline: service pods must need no Kubernetes API access (no TokenReview). The
operator reads the cluster's service-account issuer discovery and publishes the keys
into etcd at `<prefix>/auth/jwks` as `{"issuer": "<iss>", "jwks": {"keys": [...]}}`;
`JwksCache` keeps that document current with the store's one watch loop
(`agenttx.store.watch`), and `ServiceAccountVerifier` checks a
token against it with PyJWT: signature (RS256 or ES256; the token's `kid` picks the
key), audience, expiry and not-before (with a small leeway), and issuer.

What it must never do: accept an algorithm the key was not published for (`alg: none`,
HS256 signed with the public key as the secret), accept a token whose key is unknown,
or say why a token was refused beyond "invalid" / "expired" (SPEC §9). A malformed
published document keeps the previous keys (logged); a deleted document means no
keys, so every token is refused. Never logs a token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt

from ..contracts.layout import Keys
from ..errors import StoreUnavailable
from ..store.client import Store
from ..store.ops import KeyValue, WatchEvent
from ..store.watch import Watch
from .principal import Principal, expired, invalid

log = logging.getLogger(__name__)

DEFAULT_AUDIENCE = "agenttx"
# Algorithms kube-apiserver signs service-account tokens with (its signing key is RSA or
# ECDSA P-256); anything else in a token header is refused before any key is touched.
ALLOWED_ALGORITHMS = ("RS256", "ES256")
# Clock skew allowed on exp/nbf/iat: go-jose's jwt.DefaultLeeway (1 minute), which
# kube-apiserver's own service-account authenticator applies via Claims.Validate.
DEFAULT_LEEWAY_S = 60.0
_SA_PREFIX = "system:serviceaccount:"
# What a hostile token can make PyJWT raise; every one of them is "invalid credentials".
_BAD_TOKEN = (jwt.PyJWTError, ValueError, TypeError)


class JwksDocumentError(ValueError):
    """The published `<prefix>/auth/jwks` document is unusable."""


@dataclass(frozen=True)
class JwksSnapshot:
    """The keys in force: issuer as published, usable keys by `kid`, etcd revision."""

    issuer: str
    keys: Mapping[str | None, jwt.PyJWK] = field(default_factory=dict)
    revision: int = 0

    @property
    def key_ids(self) -> frozenset[str | None]:
        return frozenset(self.keys)


NO_KEYS = JwksSnapshot(issuer="")


def parse_jwks_document(data: bytes, revision: int = 0) -> JwksSnapshot:
    """Parse the operator's document. Keys that are not RS256/ES256 signature keys are
    skipped (logged by kid); a document with no usable key is an error."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JwksDocumentError(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(doc, dict):
        raise JwksDocumentError('expected {"issuer": ..., "jwks": {"keys": [...]}}')
    issuer = doc.get("issuer", "")
    if not isinstance(issuer, str):
        raise JwksDocumentError('"issuer" must be a string')
    jwks = doc.get("jwks")
    raw_keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if not isinstance(raw_keys, list):
        raise JwksDocumentError('"jwks.keys" must be a list')
    keys: dict[str | None, jwt.PyJWK] = {}
    for index, raw in enumerate(raw_keys):
        kid = raw.get("kid") if isinstance(raw, dict) else None
        why = _unusable(raw)
        if why is None:
            try:
                key = jwt.PyJWK(raw)
            except jwt.PyJWTError as exc:
                why = f"cannot build key: {type(exc).__name__}"
            else:
                if key.algorithm_name not in ALLOWED_ALGORITHMS:
                    why = f"algorithm {key.algorithm_name} not accepted"
                elif kid in keys:
                    why = "duplicate kid"
                else:
                    keys[kid] = key
                    continue
        log.warning("skipping published service-account key",
                    extra={"index": index, "kid": kid if isinstance(kid, str) else None,
                           "reason": why})
    if not keys:
        raise JwksDocumentError("no usable RS256/ES256 key in jwks.keys")
    return JwksSnapshot(issuer=issuer, keys=keys, revision=revision)


def _unusable(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return "not an object"
    if raw.get("kty") not in ("RSA", "EC"):
        return f"key type {raw.get('kty')!r} not accepted"
    if raw.get("use", "sig") != "sig":
        return "not a signature key"
    if "d" in raw:
        return "private key material published"
    kid = raw.get("kid")
    if kid is not None and not isinstance(kid, str):
        return "kid must be a string"
    return None


class ServiceAccountVerifier:
    """Checks one bearer token against the keys in force; returns its Principal or raises
    errors.Unauthenticated ("invalid credentials" / "expired credentials")."""

    def __init__(self, keys: Callable[[], JwksSnapshot | None], *,
                 audience: str = DEFAULT_AUDIENCE, issuer: str | None = None,
                 leeway_s: float = DEFAULT_LEEWAY_S) -> None:
        self._keys = keys
        self.audience = audience
        self.issuer_override = issuer or None
        self.leeway_s = leeway_s
        self._warned: JwksSnapshot | None = None

    def verify(self, token: str) -> Principal:
        snapshot = self._keys()
        if snapshot is None:
            # Never loaded: etcd has not answered since start-up. Not the caller's fault,
            # so UNAVAILABLE (retry) rather than "invalid credentials".
            raise StoreUnavailable("service-account keys not loaded yet (etcd unreachable)")
        try:
            header = jwt.get_unverified_header(token)
        except _BAD_TOKEN:
            raise invalid() from None
        alg = header.get("alg")
        if alg not in ALLOWED_ALGORITHMS:
            raise invalid()
        kid = header.get("kid")
        key = snapshot.keys.get(kid) if isinstance(kid, str | None) else None
        if key is None and kid is None and len(snapshot.keys) == 1:
            key = next(iter(snapshot.keys.values()))  # an issuer with one unnamed key
        if key is None or key.algorithm_name != alg:
            raise invalid()
        issuer = self.issuer_override or snapshot.issuer
        if not issuer:
            if self._warned is not snapshot:  # once per published document, not per call
                self._warned = snapshot
                log.error("no service-account issuer known (none published with the keys "
                          "and --auth-k8s-issuer unset); refusing tokens")
            raise invalid()
        try:
            claims = jwt.decode(token, key=key, algorithms=[alg], audience=self.audience,
                                issuer=issuer, leeway=self.leeway_s,
                                options={"require": ["exp", "iss", "aud", "sub"]})
        except jwt.ExpiredSignatureError:
            raise expired() from None
        except _BAD_TOKEN:
            raise invalid() from None
        return principal_from_claims(claims)


def principal_from_claims(claims: Mapping[str, Any]) -> Principal:
    """`system:serviceaccount:<ns>:<name>` in namespace <ns>, from the `kubernetes.io`
    claim (falling back to `sub`); the two must agree when both are present."""
    from_sub = _parse_sub(claims.get("sub"))
    k8s = claims.get("kubernetes.io")
    if isinstance(k8s, dict):
        sa = k8s.get("serviceaccount")
        ns, name = k8s.get("namespace"), sa.get("name") if isinstance(sa, dict) else None
        if not (_valid_part(ns) and _valid_part(name)):
            raise invalid()
        if from_sub is not None and from_sub != (ns, name):
            raise invalid()
    elif from_sub is not None:
        ns, name = from_sub
    else:
        raise invalid()
    return Principal(name=f"{_SA_PREFIX}{ns}:{name}", namespace=ns, roles=frozenset())


def _parse_sub(sub: Any) -> tuple[str, str] | None:
    if not isinstance(sub, str) or not sub.startswith(_SA_PREFIX):
        return None
    parts = sub[len(_SA_PREFIX):].split(":")
    if len(parts) != 2 or not all(_valid_part(p) for p in parts):
        return None
    return parts[0], parts[1]


def _valid_part(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and ":" not in value


class JwksCache(Watch):
    """The published service-account keys, kept current by watching `<prefix>/auth/jwks`
    (the store's one watch loop, `agenttx.store.watch.Watch`).

    `current` is None until the first successful load (then the verifier answers
    UNAVAILABLE); afterwards it is always the last good snapshot, even while the watch
    is being re-established after an etcd outage.
    """

    def __init__(self, store: Store, keys: Keys) -> None:
        super().__init__(store, keys.auth_jwks(), prefix=False, what="auth")
        self.current: JwksSnapshot | None = None

    def snapshot(self) -> JwksSnapshot | None:
        return self.current

    def on_snapshot(self, kvs: Sequence[KeyValue], revision: int) -> None:
        kv = kvs[0] if kvs else None
        self._apply(kv.value if kv else None, kv.mod_revision if kv else revision)

    def on_event(self, event: WatchEvent) -> None:
        self._apply(event.value, event.revision)

    def _apply(self, value: bytes | None, revision: int) -> None:
        if value is None:
            if self.current is None or self.current.keys:
                log.warning("no service-account keys published; kubernetes tokens are refused",
                            extra={"key": self.key.decode()})
            self.current = JwksSnapshot(issuer="", keys={}, revision=revision)
            return
        try:
            snapshot = parse_jwks_document(value, revision)
        except JwksDocumentError as exc:
            kept = sorted(str(k) for k in self.current.keys) if self.current else []
            log.error("ignoring malformed service-account key document; keeping the previous keys",
                      extra={"key": self.key.decode(), "error": str(exc), "kept_kids": kept})
            if self.current is None:
                self.current = JwksSnapshot(issuer="", keys={}, revision=revision)
            return
        self.current = snapshot
        log.info("service-account keys loaded",
                 extra={"issuer": snapshot.issuer, "kids": sorted(str(k) for k in snapshot.keys),
                        "revision": revision})
