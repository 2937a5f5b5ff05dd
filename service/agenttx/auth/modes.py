"""The `--auth` modes, and the start-up rule for `--auth none` (docs/security.md#none).

Why a rule at start-up: without authentication every caller is the same principal, so
anyone who can reach the port can read and end everyone's transactions. That is fine
on a loopback address (the embedded development default) and nowhere else unless the
operator says so explicitly with `--allow-unauthenticated`.

Pure: no sockets are opened and no names are resolved; a host name other than
`localhost` counts as non-loopback (the safe answer).
"""

from __future__ import annotations

import ipaddress
from enum import StrEnum

from .principal import AuthConfigError


class AuthMode(StrEnum):
    NONE = "none"
    TOKEN = "token"
    KUBERNETES = "kubernetes"
    MTLS = "mtls"


def parse_mode(value: str) -> AuthMode:
    try:
        return AuthMode(value.strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in AuthMode)
        raise AuthConfigError(f"--auth {value!r}: expected one of {choices}") from None


def is_loopback_listen(listen: str) -> bool:
    """True when a gRPC listen address only accepts local connections: a loopback IP
    (127.0.0.0/8, ::1), `localhost`, or a unix socket. `:port`, `0.0.0.0`, `[::]` and
    other host names are not."""
    address = listen.strip()
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("ipv4:", "ipv6:", "dns:///", "dns:"):
        if address.startswith(scheme):
            address = address[len(scheme):]
            break
    if address.startswith("["):  # [v6]:port
        host = address[1:address.find("]")] if "]" in address else ""
    elif address.count(":") == 1:
        host = address.rsplit(":", 1)[0]
    elif address.count(":") > 1:  # a bare IPv6 literal without a port
        host = address
    else:
        host = address
    host = host.split("%", 1)[0]  # an IPv6 zone id
    if host.rstrip(".").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen_allowed(listen: str, mode: str | AuthMode, allow_unauthenticated: bool) -> None:
    """Raise AuthConfigError when `--auth none` would serve a non-loopback address without
    `--allow-unauthenticated` (or when the mode is unknown)."""
    if parse_mode(mode) is not AuthMode.NONE or allow_unauthenticated:
        return
    if not is_loopback_listen(listen):
        raise AuthConfigError(
            f"--auth none on --listen {listen} would let every client that can reach it act "
            "as the same unauthenticated principal; listen on a loopback address "
            "(127.0.0.1, ::1, localhost), choose --auth token, kubernetes or mtls, or pass "
            "--allow-unauthenticated to accept that risk")
