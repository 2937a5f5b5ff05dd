"""The one entry point the servicer calls: credentials of a call -> Principal
(docs/security.md#authentication---auth).

Why a facade: the servicer, the quota and the audit log need a Principal and do not
care which of the four modes produced it; the modes' state (a token file that is
re-read, keys kept current from etcd) starts and stops with the server.

What it must never do: log, return or store a token; or answer a refused call with
more than "missing credentials", "invalid credentials" or "expired credentials".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..config import Settings
from ..contracts.layout import Keys
from ..store.client import Store
from .kubernetes import JwksCache, ServiceAccountVerifier
from .modes import AuthMode, check_listen_allowed, is_loopback_listen, parse_mode
from .mtls import principal_from_auth_context
from .principal import ANONYMOUS, AuthConfigError, Principal, invalid, missing
from .tokens import TokenFile

log = logging.getLogger(__name__)

Metadata = Iterable[tuple[str, str | bytes]]


def bearer_token(metadata: Metadata | None) -> str:
    """The token of the call's one `authorization: Bearer <token>` entry (scheme matched
    case-insensitively). None -> "missing"; several, another scheme or a malformed
    value -> "invalid"."""
    values = [value for key, value in (metadata or ()) if key.lower() == "authorization"]
    if not values:
        raise missing()
    if len(values) > 1:
        raise invalid()
    value = values[0]
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise invalid() from None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise invalid()
    token = token.strip()
    if not token:
        raise missing()
    if any(c.isspace() for c in token):
        raise invalid()
    return token


class Authenticator:
    """`await authenticate(metadata, auth_context) -> Principal`, for one `--auth` mode.

    Build it with `from_settings`; `await start()` before serving, `await stop()` after.
    """

    def __init__(self, mode: AuthMode | str, *, tokens: TokenFile | None = None,
                 jwks: JwksCache | None = None,
                 verifier: ServiceAccountVerifier | None = None) -> None:
        self.mode = parse_mode(mode)
        self.tokens = tokens
        self.jwks = jwks
        self.verifier = verifier
        if self.mode is AuthMode.TOKEN and tokens is None:
            raise ValueError("token mode needs a TokenFile")
        if self.mode is AuthMode.KUBERNETES and verifier is None:
            raise ValueError("kubernetes mode needs a ServiceAccountVerifier")

    @classmethod
    def from_settings(cls, settings: Settings, *, store: Store | None = None) -> Authenticator:
        """Check the settings (AuthConfigError, a start-up error) and build the mode's
        parts. `store` is needed for `--auth kubernetes` (keys come from etcd)."""
        mode = parse_mode(settings.auth)
        check_listen_allowed(settings.listen, mode, settings.allow_unauthenticated)
        if (mode in (AuthMode.TOKEN, AuthMode.KUBERNETES) and not settings.tls_cert_file
                and not is_loopback_listen(settings.listen)):
            log.warning("bearer tokens will cross the network in plaintext: serve TLS "
                        "(--tls-cert-file/--tls-key-file) unless a mesh or proxy terminates "
                        "TLS in front of this port", extra={"listen": settings.listen})
        if mode is AuthMode.TOKEN:
            if not settings.auth_tokens_file:
                raise AuthConfigError("--auth token needs --auth-tokens-file")
            return cls(mode, tokens=TokenFile(settings.auth_tokens_file))
        if mode is AuthMode.KUBERNETES:
            if store is None:
                raise ValueError("--auth kubernetes needs the etcd store for its keys")
            if not settings.auth_k8s_audience.strip():
                raise AuthConfigError("--auth kubernetes needs a non-empty --auth-k8s-audience")
            jwks = JwksCache(store, Keys(settings.etcd_prefix))
            verifier = ServiceAccountVerifier(jwks.snapshot, audience=settings.auth_k8s_audience,
                                              issuer=settings.auth_k8s_issuer)
            return cls(mode, jwks=jwks, verifier=verifier)
        if mode is AuthMode.MTLS:
            if not (settings.tls_cert_file and settings.tls_key_file and settings.tls_client_ca_file):
                raise AuthConfigError("--auth mtls needs --tls-cert-file, --tls-key-file and "
                                      "--tls-client-ca-file (clients must present a certificate)")
        return cls(mode)

    async def start(self) -> None:
        if self.jwks is not None:
            try:
                await self.jwks.load()
            except Exception as exc:
                log.warning("etcd not reachable at start-up; service-account keys will load "
                            "in the background", extra={"error": str(exc)})
            self.jwks.start()

    async def stop(self) -> None:
        if self.jwks is not None:
            await self.jwks.stop()

    async def authenticate(self, metadata: Metadata | None,
                           auth_context: Mapping[str, Sequence[bytes]] | None) -> Principal:
        """The caller's Principal, or errors.Unauthenticated. In kubernetes mode, before
        the keys were ever loaded from etcd: errors.StoreUnavailable."""
        if self.mode is AuthMode.NONE:
            return ANONYMOUS
        if self.mode is AuthMode.MTLS:
            return principal_from_auth_context(auth_context)
        token = bearer_token(metadata)
        if self.mode is AuthMode.TOKEN:
            assert self.tokens is not None
            if self.tokens.refresh_due():
                await asyncio.to_thread(self.tokens.refresh)
            principal = self.tokens.lookup(token)
            if principal is None:
                raise invalid()
            return principal
        assert self.verifier is not None
        return self.verifier.verify(token)

    async def authenticate_call(self, context: Any) -> Principal:
        """`authenticate` for a grpc.aio.ServicerContext."""
        auth_context: Mapping[str, Sequence[bytes]] | None = None
        with contextlib.suppress(Exception):  # a plaintext call has no auth context
            auth_context = context.auth_context()
        return await self.authenticate(context.invocation_metadata(), auth_context)
