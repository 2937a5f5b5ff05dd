"""Real credentials for the auth tests: a CA, server and client certificates (SPIFFE URI
SANs included), and RS256/ES256 ServiceAccount-style JWTs with the matching JWKS.

Everything is generated with `cryptography` and PyJWT at test time; nothing is a
canned fixture file, nothing is mocked. EC P-256 keys for certificates keep it fast.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import os
import pathlib
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

K8S_ISSUER = "https://kubernetes.default.svc.cluster.local"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _pem_key(key: Any) -> bytes:
    return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def write_atomically(path: pathlib.Path, data: bytes | str) -> None:
    """Write a sibling temp file, then rename it over `path` (how Secret volumes and
    careful tools rotate files: readers see the old or the new file, never half)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: Any
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
        directory.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
        write_atomically(cert_path, self.cert_pem)
        write_atomically(key_path, self.key_pem)
        return cert_path, key_path


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, name: str = "AgentTx Test CA") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, directory: pathlib.Path, name: str = "ca") -> pathlib.Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.crt"
        write_atomically(path, self.cert_pem)
        return path

    def issue(self, *, common_name: str | None = None, uris: Iterable[str] = (),
              dns: Iterable[str] = (), ips: Iterable[str] = (), server: bool = False,
              client: bool = False, key: Any = None) -> Issued:
        key = key or ec.generate_private_key(ec.SECP256R1())
        now = _now()
        names = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(names)).issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                           critical=False)
        )
        alt: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
        alt += [x509.DNSName(d) for d in dns]
        alt += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if alt:
            # RFC 5280: with an empty subject the SAN extension must be critical.
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=not names)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert, key, cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))

    def server(self, common_name: str = "localhost") -> Issued:
        """A server certificate for localhost / 127.0.0.1 / ::1."""
        return self.issue(common_name=common_name, dns=["localhost"], ips=["127.0.0.1", "::1"],
                          server=True)

    def client(self, common_name: str | None = None, *, uris: Iterable[str] = ()) -> Issued:
        return self.issue(common_name=common_name, uris=uris, client=True)


def spiffe_id(namespace: str, service_account: str, trust_domain: str = "cluster.local") -> str:
    """Istio's form: spiffe://<trust-domain>/ns/<ns>/sa/<name>."""
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class ServiceAccountIssuer:
    """Signs ServiceAccount tokens the way kube-apiserver does (projected token claims)."""

    def __init__(self, issuer: str = K8S_ISSUER, *, alg: str = "RS256",
                 kid: str | None = None) -> None:
        if alg not in ("RS256", "ES256"):
            raise ValueError(alg)
        self.issuer = issuer
        self.alg = alg
        self.kid = kid if kid is not None else uuid.uuid4().hex[:16]
        self.key: Any = (rsa.generate_private_key(public_exponent=65537, key_size=2048)
                         if alg == "RS256" else ec.generate_private_key(ec.SECP256R1()))

    def public_pem(self) -> bytes:
        return bytes(self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def jwk(self) -> dict[str, Any]:
        """The public key as kube-apiserver publishes it at /openid/v1/jwks."""
        algo = jwt.algorithms.RSAAlgorithm if self.alg == "RS256" else jwt.algorithms.ECAlgorithm
        doc: dict[str, Any] = dict(algo.to_jwk(self.key.public_key(), as_dict=True))
        doc.update({"use": "sig", "alg": self.alg, "kid": self.kid})
        return doc

    def claims(self, namespace: str = "team-a", name: str = "billing-agent", *,
               audience: str | list[str] = "agenttx", issued_ago_s: float = 0,
               lifetime_s: float = 3600, not_before_in_s: float | None = None,
               issuer: str | None = None, kubernetes_claim: bool = True,
               subject: str | None = None) -> dict[str, Any]:
        """Claims of a projected token issued `issued_ago_s` ago, valid `lifetime_s`
        from then; `not_before_in_s` moves nbf into the future."""
        issued = int(time.time() - issued_ago_s)
        claims: dict[str, Any] = {
            "iss": issuer or self.issuer,
            "sub": subject if subject is not None else f"system:serviceaccount:{namespace}:{name}",
            "aud": [audience] if isinstance(audience, str) else audience,
            "iat": issued,
            "nbf": issued if not_before_in_s is None else int(time.time() + not_before_in_s),
            "exp": issued + int(lifetime_s),
            "jti": uuid.uuid4().hex,
        }
        if kubernetes_claim:
            claims["kubernetes.io"] = {
                "namespace": namespace,
                "serviceaccount": {"name": name, "uid": str(uuid.uuid4())},
                "pod": {"name": f"{name}-7d4b9c-x2x9z", "uid": str(uuid.uuid4())},
            }
        return claims

    def sign(self, claims: Mapping[str, Any], *, headers: Mapping[str, Any] | None = None) -> str:
        hdr = {"kid": self.kid, **(headers or {})}
        return jwt.encode(dict(claims), self.key, algorithm=self.alg, headers=hdr)

    def mint(self, namespace: str = "team-a", name: str = "billing-agent", **kw: Any) -> str:
        return self.sign(self.claims(namespace, name, **kw))


def jwks_document(issuer: str, *signers: ServiceAccountIssuer,
                  extra_keys: Iterable[Any] = ()) -> bytes:
    """The operator's `<prefix>/auth/jwks` value: {"issuer", "jwks": {"keys": [...]}};
    `extra_keys` go in as given (other key types, junk)."""
    keys = [s.jwk() for s in signers] + list(extra_keys)
    return json.dumps({"issuer": issuer, "jwks": {"keys": keys}}).encode()


def forge_unsigned(claims: Mapping[str, Any], kid: str | None = None) -> str:
    """An `alg: none` token (no signature), as an attacker would send it."""
    header: dict[str, Any] = {"alg": "none", "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(dict(claims)).encode())}."


def forge_hs256(claims: Mapping[str, Any], secret: bytes, kid: str | None = None) -> str:
    """An HS256 token whose HMAC secret is `secret` — with the issuer's public key PEM as
    the secret this is the classic RS256->HS256 key-confusion attack (built by hand:
    PyJWT itself refuses to use a PEM key as an HMAC secret)."""
    header: dict[str, Any] = {"alg": "HS256", "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(dict(claims)).encode())}"
    sig = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(sig)}"
