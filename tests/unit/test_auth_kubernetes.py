"""`--auth kubernetes`: offline verification of projected ServiceAccount tokens
(docs/security.md#kubernetes).

Real RS256/ES256 keys and tokens signed with them (tests/support/certs.py); every
refusal must say exactly "invalid credentials" or "expired credentials".
"""

from __future__ import annotations

import base64
import json
import logging

import pytest

from agenttx import errors
from agenttx.auth import JwksSnapshot, Principal, ServiceAccountVerifier, parse_jwks_document
from agenttx.auth.kubernetes import JwksDocumentError, principal_from_claims
from support.certs import K8S_ISSUER, ServiceAccountIssuer, forge_hs256, forge_unsigned, jwks_document


@pytest.fixture(scope="module")
def rsa_issuer() -> ServiceAccountIssuer:
    return ServiceAccountIssuer(alg="RS256", kid="rsa-1")


@pytest.fixture(scope="module")
def ec_issuer() -> ServiceAccountIssuer:
    return ServiceAccountIssuer(alg="ES256", kid="ec-1")


@pytest.fixture(scope="module")
def snapshot(rsa_issuer: ServiceAccountIssuer, ec_issuer: ServiceAccountIssuer) -> JwksSnapshot:
    return parse_jwks_document(jwks_document(K8S_ISSUER, rsa_issuer, ec_issuer), revision=7)


@pytest.fixture
def verifier(snapshot: JwksSnapshot) -> ServiceAccountVerifier:
    return ServiceAccountVerifier(lambda: snapshot)


def refused(verifier: ServiceAccountVerifier, token: str) -> str:
    with pytest.raises(errors.Unauthenticated) as err:
        verifier.verify(token)
    return str(err.value)


TEAM_A_BILLING = Principal("system:serviceaccount:team-a:billing-agent", "team-a", frozenset())


@pytest.mark.parametrize("issuer_fixture", ["rsa_issuer", "ec_issuer"])
def test_valid_token_gives_the_service_account_principal(
        request: pytest.FixtureRequest, verifier: ServiceAccountVerifier, issuer_fixture: str) -> None:
    issuer: ServiceAccountIssuer = request.getfixturevalue(issuer_fixture)
    principal = verifier.verify(issuer.mint("team-a", "billing-agent"))
    assert principal == TEAM_A_BILLING
    assert not principal.is_admin


def test_expired_token_is_expired(verifier: ServiceAccountVerifier,
                                  rsa_issuer: ServiceAccountIssuer) -> None:
    token = rsa_issuer.mint(issued_ago_s=7200, lifetime_s=3600)
    assert refused(verifier, token) == "expired credentials"


def test_expiry_has_a_small_leeway(verifier: ServiceAccountVerifier, snapshot: JwksSnapshot,
                                   rsa_issuer: ServiceAccountIssuer) -> None:
    # expired 20 s ago: within the 60 s clock-skew leeway
    assert verifier.verify(rsa_issuer.mint(issued_ago_s=3620, lifetime_s=3600)) == TEAM_A_BILLING
    strict = ServiceAccountVerifier(lambda: snapshot, leeway_s=0)
    assert refused(strict, rsa_issuer.mint(issued_ago_s=3620, lifetime_s=3600)) == "expired credentials"


def test_not_yet_valid_token_is_invalid(verifier: ServiceAccountVerifier,
                                        rsa_issuer: ServiceAccountIssuer) -> None:
    assert refused(verifier, rsa_issuer.mint(not_before_in_s=600)) == "invalid credentials"


def test_wrong_audience_is_invalid(verifier: ServiceAccountVerifier,
                                   rsa_issuer: ServiceAccountIssuer) -> None:
    # the API server's own audience: a token meant for Kubernetes must not work here
    token = rsa_issuer.mint(audience=["https://kubernetes.default.svc.cluster.local"])
    assert refused(verifier, token) == "invalid credentials"


def test_custom_audience(snapshot: JwksSnapshot, rsa_issuer: ServiceAccountIssuer) -> None:
    v = ServiceAccountVerifier(lambda: snapshot, audience="agenttx-prod")
    assert v.verify(rsa_issuer.mint(audience=["vault", "agenttx-prod"])) == TEAM_A_BILLING
    assert refused(v, rsa_issuer.mint(audience="agenttx")) == "invalid credentials"


def test_wrong_issuer_is_invalid(verifier: ServiceAccountVerifier,
                                 rsa_issuer: ServiceAccountIssuer) -> None:
    assert refused(verifier, rsa_issuer.mint(issuer="https://evil.example")) == "invalid credentials"


def test_explicit_issuer_overrides_the_published_one(snapshot: JwksSnapshot,
                                                     rsa_issuer: ServiceAccountIssuer) -> None:
    v = ServiceAccountVerifier(lambda: snapshot, issuer="https://oidc.eks.example/id/ABC")
    assert v.verify(rsa_issuer.mint(issuer="https://oidc.eks.example/id/ABC")) == TEAM_A_BILLING
    assert refused(v, rsa_issuer.mint()) == "invalid credentials"  # the published issuer


def test_no_issuer_known_refuses_every_token(rsa_issuer: ServiceAccountIssuer,
                                             caplog: pytest.LogCaptureFixture) -> None:
    snap = parse_jwks_document(jwks_document("", rsa_issuer))
    v = ServiceAccountVerifier(lambda: snap)
    with caplog.at_level(logging.ERROR, logger="agenttx.auth.kubernetes"):
        assert refused(v, rsa_issuer.mint(issuer="")) == "invalid credentials"
        assert refused(v, rsa_issuer.mint()) == "invalid credentials"
    assert [r.getMessage() for r in caplog.records] == [
        "no service-account issuer known (none published with the keys and --auth-k8s-issuer "
        "unset); refusing tokens"]  # once, not per call


def test_unknown_kid_is_invalid(verifier: ServiceAccountVerifier,
                                rsa_issuer: ServiceAccountIssuer) -> None:
    token = rsa_issuer.sign(rsa_issuer.claims(), headers={"kid": "rotated-away"})
    assert refused(verifier, token) == "invalid credentials"


def test_bad_signature_is_invalid(verifier: ServiceAccountVerifier,
                                  rsa_issuer: ServiceAccountIssuer) -> None:
    impostor = ServiceAccountIssuer(alg="RS256", kid=rsa_issuer.kid)  # same kid, other key
    assert refused(verifier, impostor.mint()) == "invalid credentials"
    # a genuine signature on changed claims
    header, _, sig = rsa_issuer.mint().split(".")
    tampered_claims = rsa_issuer.claims("kube-system", "admin")
    forged_payload = base64.urlsafe_b64encode(json.dumps(tampered_claims).encode()).rstrip(b"=")
    assert refused(verifier, f"{header}.{forged_payload.decode()}.{sig}") == "invalid credentials"


def test_alg_none_is_invalid(verifier: ServiceAccountVerifier,
                             rsa_issuer: ServiceAccountIssuer) -> None:
    assert refused(verifier, forge_unsigned(rsa_issuer.claims(), kid=rsa_issuer.kid)) == \
        "invalid credentials"
    assert refused(verifier, forge_unsigned(rsa_issuer.claims())) == "invalid credentials"


def test_hs256_key_confusion_is_invalid(verifier: ServiceAccountVerifier,
                                        rsa_issuer: ServiceAccountIssuer) -> None:
    public_pem = rsa_issuer.public_pem()
    for kid in (rsa_issuer.kid, None):
        token = forge_hs256(rsa_issuer.claims(), public_pem, kid=kid)
        assert refused(verifier, token) == "invalid credentials"


def test_algorithm_must_match_the_keys_algorithm(verifier: ServiceAccountVerifier,
                                                 rsa_issuer: ServiceAccountIssuer,
                                                 ec_issuer: ServiceAccountIssuer) -> None:
    # an ES256 token naming the RSA key's kid
    token = ec_issuer.sign(ec_issuer.claims(), headers={"kid": rsa_issuer.kid})
    assert refused(verifier, token) == "invalid credentials"


@pytest.mark.parametrize("token", ["", "not-a-jwt", "a.b.c", "eyJhbGciOiJSUzI1NiJ9..",
                                   "\u00e9\u00e9.\u00e9.\u00e9"])
def test_garbage_is_invalid(verifier: ServiceAccountVerifier, token: str) -> None:
    assert refused(verifier, token) == "invalid credentials"


def test_missing_required_claims_are_invalid(verifier: ServiceAccountVerifier,
                                             rsa_issuer: ServiceAccountIssuer) -> None:
    for claim in ("exp", "aud", "iss", "sub"):
        claims = rsa_issuer.claims()
        del claims[claim]
        assert refused(verifier, rsa_issuer.sign(claims)) == "invalid credentials", claim


def test_keys_never_loaded_is_unavailable_not_a_credential_problem(
        rsa_issuer: ServiceAccountIssuer) -> None:
    v = ServiceAccountVerifier(lambda: None)
    with pytest.raises(errors.StoreUnavailable):
        v.verify(rsa_issuer.mint())


def test_deleted_document_refuses_every_token(rsa_issuer: ServiceAccountIssuer) -> None:
    v = ServiceAccountVerifier(lambda: JwksSnapshot(issuer="", keys={}))
    assert refused(v, rsa_issuer.mint()) == "invalid credentials"


def test_principal_falls_back_to_sub_and_both_must_agree() -> None:
    assert principal_from_claims({"sub": "system:serviceaccount:team-b:etl"}) == Principal(
        "system:serviceaccount:team-b:etl", "team-b", frozenset())
    k8s = {"namespace": "team-a", "serviceaccount": {"name": "billing-agent"}}
    assert principal_from_claims({"kubernetes.io": k8s, "sub": "something-else"}) == TEAM_A_BILLING
    for claims in ({"kubernetes.io": k8s, "sub": "system:serviceaccount:team-b:billing-agent"},
                   {"sub": "system:serviceaccount:team-b"},
                   {"sub": "system:serviceaccount:a:b:c"},
                   {"sub": "user@example.com"},
                   {"kubernetes.io": {"namespace": "team-a"}},
                   {"kubernetes.io": {"namespace": "", "serviceaccount": {"name": "x"}}}):
        with pytest.raises(errors.Unauthenticated, match="^invalid credentials$"):
            principal_from_claims(claims)


def test_jwks_document_parsing(rsa_issuer: ServiceAccountIssuer, ec_issuer: ServiceAccountIssuer,
                               caplog: pytest.LogCaptureFixture) -> None:
    hmac_key = {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac", "alg": "HS256"}
    enc_key = dict(rsa_issuer.jwk(), kid="enc", use="enc")
    with caplog.at_level(logging.WARNING, logger="agenttx.auth.kubernetes"):
        snap = parse_jwks_document(jwks_document(K8S_ISSUER, rsa_issuer, ec_issuer,
                                                 extra_keys=[hmac_key, enc_key, "junk"]), revision=3)
    assert snap.issuer == K8S_ISSUER and snap.revision == 3
    assert snap.key_ids == {"rsa-1", "ec-1"}
    reasons = sorted(r.reason for r in caplog.records)  # type: ignore[attr-defined]
    assert reasons == ["key type 'oct' not accepted", "not a signature key", "not an object"]
    assert "c2VjcmV0" not in caplog.text


@pytest.mark.parametrize("data, message", [
    (b"{", "not JSON: JSONDecodeError"),
    (b"[]", 'expected {"issuer": ..., "jwks": {"keys": [...]}}'),
    (b'{"issuer": 5, "jwks": {"keys": []}}', '"issuer" must be a string'),
    (b'{"issuer": "x", "jwks": []}', '"jwks.keys" must be a list'),
    (b'{"issuer": "x", "jwks": {"keys": []}}', "no usable RS256/ES256 key in jwks.keys"),
    (b'{"issuer": "x", "jwks": {"keys": [{"kty": "RSA", "n": "AQAB", "e": "!!"}]}}',
     "no usable RS256/ES256 key in jwks.keys"),
])
def test_malformed_jwks_documents(data: bytes, message: str) -> None:
    with pytest.raises(JwksDocumentError) as err:
        parse_jwks_document(data)
    assert str(err.value) == message
