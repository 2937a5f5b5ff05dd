"""`--auth none` is refused on a non-loopback `--listen` unless allowed (docs/security.md#none). Pure."""

from __future__ import annotations

import pytest

from agenttx.auth import AuthConfigError, AuthMode, check_listen_allowed, is_loopback_listen
from agenttx.auth.modes import parse_mode


@pytest.mark.parametrize("listen", ["127.0.0.1:50051", "127.1.2.3:1", "localhost:50051",
                                    "LOCALHOST.:1", "[::1]:50051", "ipv4:127.0.0.1:5",
                                    "unix:/run/agenttx.sock", "unix-abstract:agenttx"])
def test_loopback_addresses(listen: str) -> None:
    assert is_loopback_listen(listen)
    check_listen_allowed(listen, "none", allow_unauthenticated=False)


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", ":50051", "[::]:50051", "10.0.0.5:50051",
                                    "agenttx.example.com:443", "[::ffff:10.0.0.1]:1", "50051"])
def test_other_addresses_refuse_auth_none(listen: str) -> None:
    assert not is_loopback_listen(listen)
    with pytest.raises(AuthConfigError) as err:
        check_listen_allowed(listen, "none", allow_unauthenticated=False)
    assert str(err.value) == (
        f"--auth none on --listen {listen} would let every client that can reach it act as the "
        "same unauthenticated principal; listen on a loopback address (127.0.0.1, ::1, "
        "localhost), choose --auth token, kubernetes or mtls, or pass --allow-unauthenticated "
        "to accept that risk")


def test_allow_unauthenticated_and_other_modes_pass() -> None:
    check_listen_allowed("0.0.0.0:50051", "none", allow_unauthenticated=True)
    for mode in ("token", "kubernetes", "mtls", AuthMode.TOKEN, "Token"):
        check_listen_allowed("0.0.0.0:50051", mode, allow_unauthenticated=False)


def test_unknown_mode_is_a_start_up_error() -> None:
    with pytest.raises(AuthConfigError) as err:
        check_listen_allowed("127.0.0.1:1", "oauth", allow_unauthenticated=False)
    assert str(err.value) == "--auth 'oauth': expected one of none, token, kubernetes, mtls"
    assert parse_mode(" MTLS ") is AuthMode.MTLS
