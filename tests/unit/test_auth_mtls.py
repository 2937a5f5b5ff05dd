"""`--auth mtls`: the principal of a client certificate (docs/security.md#mtls). Real certificates."""

from __future__ import annotations

import pytest

from agenttx import errors
from agenttx.auth import Principal, principal_from_auth_context, principal_from_certificate, spiffe_namespace
from support.certs import CertificateAuthority, spiffe_id


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority()


def test_first_uri_san_is_the_principal_and_spiffe_gives_the_namespace(
        ca: CertificateAuthority) -> None:
    sid = spiffe_id("team-a", "billing-agent")
    cert = ca.client("ignored-cn", uris=[sid, "spiffe://cluster.local/ns/team-b/sa/other"])
    assert principal_from_certificate(cert.cert_pem) == Principal(
        "spiffe://cluster.local/ns/team-a/sa/billing-agent", "team-a", frozenset())


def test_non_spiffe_uri_san_has_no_namespace(ca: CertificateAuthority) -> None:
    cert = ca.client("cn", uris=["urn:agent:billing"])
    assert principal_from_certificate(cert.cert_pem) == Principal("urn:agent:billing", None)


def test_common_name_when_there_is_no_uri_san(ca: CertificateAuthority) -> None:
    cert = ca.issue(common_name="billing-agent", dns=["billing.example"], client=True)
    assert principal_from_certificate(cert.cert_pem) == Principal("billing-agent", None)


def test_certificate_without_uri_san_or_cn_is_invalid(ca: CertificateAuthority) -> None:
    cert = ca.issue(dns=["billing.example"], client=True)
    with pytest.raises(errors.Unauthenticated, match="^invalid credentials$"):
        principal_from_certificate(cert.cert_pem)


def test_auth_context_of_a_grpc_call(ca: CertificateAuthority) -> None:
    cert = ca.client(uris=[spiffe_id("team-c", "etl")])
    ctx = {"transport_security_type": [b"ssl"], "x509_pem_cert": [cert.cert_pem]}
    assert principal_from_auth_context(ctx).namespace == "team-c"
    for empty in (None, {}, {"transport_security_type": [b"ssl"]}, {"x509_pem_cert": []}):
        with pytest.raises(errors.Unauthenticated, match="^missing credentials$"):
            principal_from_auth_context(empty)
    with pytest.raises(errors.Unauthenticated, match="^invalid credentials$"):
        principal_from_auth_context({"x509_pem_cert": [b"-----BEGIN CERTIFICATE-----\nxx\n"]})


@pytest.mark.parametrize("uri, namespace", [
    ("spiffe://cluster.local/ns/team-a/sa/billing", "team-a"),
    ("spiffe://prod.example.org/ns/payments/sa/default", "payments"),
    ("spiffe://cluster.local/ns/team-a/sa/", None),
    ("spiffe://cluster.local/ns//sa/billing", None),
    ("spiffe://cluster.local/ns/team-a", None),
    ("spiffe://cluster.local/ns/team-a/sa/billing/extra", None),
    ("spiffe://cluster.local/sa/billing/ns/team-a", None),
    ("spiffe:///ns/team-a/sa/billing", None),
    ("spiffe://cluster.local/ns/team-a/sa/billing?x=1", None),
    ("https://cluster.local/ns/team-a/sa/billing", None),
    ("urn:x", None),
])
def test_spiffe_namespace_only_from_istios_exact_form(uri: str, namespace: str | None) -> None:
    assert spiffe_namespace(uri) == namespace
