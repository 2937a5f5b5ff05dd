"""`--auth mtls`: the principal is the verified client certificate (docs/security.md#mtls).

Why from the certificate: with `--tls-client-ca-file` gRPC has already verified the
chain during the handshake, so the leaf certificate in the call's auth context *is*
the proof. The principal is its first URI SAN (a SPIFFE id in a mesh), else its
subject CN; the namespace is `<ns>` of Istio's `spiffe://<domain>/ns/<ns>/sa/<name>`,
else none (then only the service namespace's policies apply).

What it must never do: trust a certificate gRPC did not verify (this mode is refused
at start-up without a client CA, see authenticator.py), or derive a namespace from
anything but that exact SPIFFE form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.x509.oid import NameOID

from .principal import Principal, invalid, missing

# The peer's leaf certificate (PEM) in grpc's ServicerContext.auth_context(), as
# grpc core's ssl transport security names it (GRPC_X509_PEM_CERT_PROPERTY_NAME).
PEM_CERT_PROPERTY = "x509_pem_cert"


def spiffe_namespace(uri: str) -> str | None:
    """`<ns>` of `spiffe://<trust-domain>/ns/<ns>/sa/<name>`, else None."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return None
    if parts.scheme != "spiffe" or not parts.netloc or parts.query or parts.fragment:
        return None
    segments = parts.path.split("/")
    if len(segments) != 5 or segments[0] != "" or segments[1] != "ns" or segments[3] != "sa":
        return None
    ns, name = segments[2], segments[4]
    return ns if ns and name else None


def principal_from_certificate(pem: bytes) -> Principal:
    """The Principal of a (verified) client certificate in PEM form."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise invalid() from None
    uris: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        pass
    except ValueError:  # a malformed extension
        raise invalid() from None
    if uris:
        return Principal(name=uris[0], namespace=spiffe_namespace(uris[0]), roles=frozenset())
    try:
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError:
        raise invalid() from None
    cn = cns[0].value if cns else ""
    if isinstance(cn, bytes):
        cn = cn.decode("utf-8", "replace")
    if not cn:
        raise invalid()
    return Principal(name=cn, namespace=None, roles=frozenset())


def principal_from_auth_context(auth_context: Mapping[str, Sequence[bytes]] | None) -> Principal:
    """From `ServicerContext.auth_context()`; no client certificate -> "missing"."""
    certs = (auth_context or {}).get(PEM_CERT_PROPERTY) or []
    if not certs:
        raise missing()
    return principal_from_certificate(certs[0])
