"""Connection flags shared by every command that talks to a running service
(`agenttx tx ...`, `agenttx mcp`): one spelling of `--target`, `--token` and TLS.

Environment: `AGENTTX_TARGET` and `AGENTTX_TOKEN`. The TLS file flags have no environment
twins on purpose: `AGENTTX_TLS_CERT_FILE` & co. configure the *server's* certificate
(`agenttx serve`), and a client must never pick those up by accident. The token is read
from the environment at use, never shown in `--help`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ._core import DEFAULT_TARGET, TLS

TARGET_ENV = "AGENTTX_TARGET"
TOKEN_ENV = "AGENTTX_TOKEN"


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--target", default=None, metavar="HOST:PORT",
                       help=f"AgentTx service address (env {TARGET_ENV}; default {DEFAULT_TARGET})")
    group.add_argument("--token", default=None,
                       help=f"bearer token sent as 'authorization: Bearer ...' (env {TOKEN_ENV})")
    group.add_argument("--tls", action="store_true",
                       help="use TLS, verifying the server against the system roots")
    group.add_argument("--tls-ca", default=None, metavar="FILE",
                       help="use TLS, verifying the server against this CA (PEM)")
    group.add_argument("--tls-cert", default=None, metavar="FILE",
                       help="client certificate (PEM) for mTLS; needs --tls-key")
    group.add_argument("--tls-key", default=None, metavar="FILE",
                       help="private key (PEM) of --tls-cert")
    group.add_argument("--tls-server-name", default=None, metavar="NAME",
                       help="name to check in the server certificate (default: the target host)")


def connection_from_args(ns: argparse.Namespace) -> dict[str, Any]:
    """`Client(**connection_from_args(ns))`. Raises ValueError for inconsistent TLS flags."""
    tls: TLS | None = None
    if ns.tls or ns.tls_ca or ns.tls_cert or ns.tls_key or ns.tls_server_name:
        tls = TLS(ca=ns.tls_ca, cert=ns.tls_cert, key=ns.tls_key, server_name=ns.tls_server_name)
    return {
        "target": ns.target or os.environ.get(TARGET_ENV) or DEFAULT_TARGET,
        "token": ns.token or os.environ.get(TOKEN_ENV) or None,
        "tls": tls,
    }
