"""Authentication, client TLS, per-principal rate quota and secret redaction (docs/security.md).

The public surface; the modules behind it are private details:

    Authenticator.from_settings(settings, store=store)   -> await start() / stop()
    await authenticator.authenticate(metadata, auth_context) -> Principal
        (raises errors.Unauthenticated: "missing|invalid|expired credentials")
    Principal(name, namespace, roles).is_admin, ANONYMOUS
    check_listen_allowed(listen, mode, allow_unauthenticated)   (AuthConfigError)
    server_credentials(cert, key, client_ca) / server_credentials_from_settings(settings)
    RateLimiter(rate_per_s).check(principal)                    (errors.ResourceExhausted)
    redact(text), RedactFilter

What this package must never do: log, return or store a credential (token, key,
password); every refusal says only "missing", "invalid" or "expired".
"""

from __future__ import annotations

from .authenticator import Authenticator, bearer_token
from .kubernetes import JwksCache, JwksSnapshot, ServiceAccountVerifier, parse_jwks_document
from .modes import AuthMode, check_listen_allowed, is_loopback_listen
from .mtls import principal_from_auth_context, principal_from_certificate, spiffe_namespace
from .principal import ADMIN_ROLE, ANONYMOUS, EXPIRED, INVALID, MISSING, AuthConfigError, Principal
from .ratelimit import RateLimiter
from .redact import RedactFilter, redact
from .tls import ReloadingCertificates, server_credentials, server_credentials_from_settings
from .tokens import TokenFile, hash_token

__all__ = [
    "ADMIN_ROLE", "ANONYMOUS", "EXPIRED", "INVALID", "MISSING",
    "AuthConfigError", "AuthMode", "Authenticator", "JwksCache", "JwksSnapshot", "Principal",
    "RateLimiter", "RedactFilter", "ReloadingCertificates", "ServiceAccountVerifier", "TokenFile",
    "bearer_token", "check_listen_allowed", "hash_token", "is_loopback_listen",
    "parse_jwks_document", "principal_from_auth_context", "principal_from_certificate",
    "redact", "server_credentials", "server_credentials_from_settings", "spiffe_namespace",
]
