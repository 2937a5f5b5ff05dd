"""The service-account issuer keys the operator publishes for `--auth kubernetes`
(docs/security.md#kubernetes).

Why: service pods verify projected ServiceAccount tokens offline and have no Kubernetes
API access, so the operator reads the cluster's issuer discovery with its own
credentials and publishes `{"issuer": "<iss>", "jwks": {"keys": [...]}}` into etcd at
`Keys(prefix).auth_jwks()`. This module turns what the API server answered into those
bytes, or refuses: a document that would make every token fail (no usable key) or that
carries private key material is never published, because the service trusts it blindly.

What it must never do: perform I/O. `handlers` fetches (through `kube`), calls these
functions, and writes the result (through `publishing`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt

# The API server's own routes for service-account issuer discovery (kubernetes
# pkg/serviceaccount/openidmetadata.go: OpenIDConfigPath, JWKSPath). The keys are
# served at JWKS_PATH whatever `jwks_uri` says: `--service-account-jwks-uri` only changes
# what the discovery document advertises to relying parties outside the cluster (often
# a host that is not reachable from inside it), never the route.
DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/openid/v1/jwks"
# The API server declares JWKS_PATH as producing only application/jwk-set+json and
# answers `Accept: application/json` alone with 406 Not Acceptable.
JWKS_ACCEPT = "application/jwk-set+json, application/json"

# RFC 7518 §6.2.2, §6.3.2, §6.4: the members that only a private or symmetric key has.
PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})


class JwksError(ValueError):
    """What the API server answered is not something to publish."""


@dataclass(frozen=True)
class Discovery:
    """The two fields of the OpenID discovery document the operator uses."""

    issuer: str
    jwks_uri: str

    @property
    def jwks_uri_path(self) -> str:
        return urlsplit(self.jwks_uri).path


def parse_discovery(doc: Any) -> Discovery:
    """`issuer` and `jwks_uri` of the API server's discovery document, or JwksError."""
    if not isinstance(doc, Mapping):
        raise JwksError(f"the discovery document is not a JSON object: {_brief(doc)}")
    issuer, jwks_uri = doc.get("issuer"), doc.get("jwks_uri")
    if not isinstance(issuer, str) or not issuer:
        raise JwksError(f"the discovery document has no issuer: {_brief(issuer)}")
    if not isinstance(jwks_uri, str) or not jwks_uri:
        raise JwksError(f"the discovery document has no jwks_uri: {_brief(jwks_uri)}")
    return Discovery(issuer=issuer, jwks_uri=jwks_uri)


def build_document(discovery: Discovery, jwks: Any) -> dict[str, Any]:
    """The document the service reads: `{"issuer": ..., "jwks": {"keys": [...]}}`.

    Raises JwksError unless `jwks` is a JSON object whose `keys` is a non-empty list of
    public JWKs (each an object with a `kty`, none with private members) of which PyJWT,
    the library that verifies the tokens, can use at least one. The keys are published
    as the API server gave them (other members of the key set are dropped).
    """
    if not isinstance(jwks, Mapping):
        raise JwksError(f"the key set is not a JSON object: {_brief(jwks)}")
    keys = jwks.get("keys")
    if not isinstance(keys, list) or not keys:
        raise JwksError(f"the key set has no keys: {_brief(keys)}")
    for i, key in enumerate(keys):
        if not isinstance(key, Mapping) or not isinstance(key.get("kty"), str):
            raise JwksError(f"key {i} is not a JWK (an object with a kty): {_brief(key)}")
        private = sorted(PRIVATE_MEMBERS & set(key))
        if private:
            raise JwksError(f"key {i} ({key.get('kid', 'no kid')}) carries private members "
                            f"{', '.join(private)}; only public keys are published")
    try:
        jwt.PyJWKSet(list(keys))
    except jwt.PyJWTError as exc:
        raise JwksError(f"the key set has no key usable for verification: {exc}") from exc
    return {"issuer": discovery.issuer, "jwks": {"keys": [dict(k) for k in keys]}}


def encode(document: Mapping[str, Any]) -> bytes:
    """Byte-stable JSON (sorted keys, no spaces): the same keys always give the same
    bytes, so an unchanged key set is never rewritten."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def describe(document: Mapping[str, Any]) -> str:
    """One line for the log: the issuer and the key ids."""
    kids = [str(k.get("kid", "?")) for k in document["jwks"]["keys"]]
    return f"issuer {document['issuer']}, {len(kids)} key(s): {', '.join(kids)}"


def _brief(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 120 else text[:117] + "..."
