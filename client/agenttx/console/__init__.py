"""`agenttx console`: a web page for the people who run AgentTx (docs/console.md).

    agenttx console --target 127.0.0.1:50051                     # http://127.0.0.1:8080
    agenttx console --target agenttx:50051 --listen 0.0.0.0:8443 \\
        --tls-cert-file console.crt --tls-key-file console.key

A server-rendered UI over the gRPC API, talking to the service only through
`agenttx.client` with each signed-in person's own token (`app`, `sessions`): the open
transactions, each one's steps and hints, approvals to decide, dead letters to retry,
rollbacks, and a status strip. It holds no credentials of its own.

Why it refuses a non-loopback `--listen` without TLS: people paste bearer tokens into its
sign-in form and its session cookie stands for them afterwards; neither may cross a
network in clear. `--allow-insecure-remote` is for a TLS-terminating proxy or a Pod
reached only through `kubectl port-forward` (the chart), and says so.

Its web stack (Starlette, uvicorn; Jinja2 from the `[console]` extra) is imported only
when the command runs, so `agenttx --help` works without the extra and the command says
in one line how to install it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..client.cliargs import add_connection_arguments, connection_from_args

DEFAULT_LISTEN = "127.0.0.1:8080"
INSTALL_HINT = ("agenttx console: the console needs its extra: pip install "
                "'agenttx-client[console]'")


def register(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx console` in the one `agenttx` parser (agenttx.cli)."""
    parser = subparsers.add_parser(
        "console", help="serve the web console for people who run AgentTx",
        description="Serve the AgentTx web console: transactions, approvals, dead letters.")
    configure(parser)
    parser.set_defaults(func=run)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=os.environ.get("AGENTTX_CONSOLE_LISTEN",
                                                           DEFAULT_LISTEN),
                        metavar="HOST:PORT",
                        help=f"address to serve the console on (env AGENTTX_CONSOLE_LISTEN; "
                        f"default {DEFAULT_LISTEN}); off loopback it needs --tls-cert-file "
                        "and --tls-key-file, or --allow-insecure-remote")
    parser.add_argument("--tls-cert-file", default=None, metavar="FILE",
                        help="serve HTTPS with this certificate (PEM); the session cookie "
                        "is then Secure")
    parser.add_argument("--tls-key-file", default=None, metavar="FILE",
                        help="private key (PEM) of --tls-cert-file")
    parser.add_argument("--allow-insecure-remote", action="store_true",
                        help="serve plain HTTP on a non-loopback address (only behind a "
                        "TLS-terminating proxy or kubectl port-forward)")
    parser.add_argument("--session-idle-timeout-s", type=float, default=1800.0,
                        metavar="SECONDS",
                        help="sign a person out after this long without a request "
                        "(default 1800)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("json", "text"), default="text")
    add_connection_arguments(parser)
    for action in parser._actions:  # the console holds no credentials of its own
        if action.dest == "token":
            action.help = argparse.SUPPRESS


def _listen(ns: argparse.Namespace) -> tuple[str, int]:
    """Where to listen, after the checks of the flags alone (no file is read)."""
    from ..mcp_server import _split_listen, is_loopback

    host, port = _split_listen(ns.listen)
    if bool(ns.tls_cert_file) != bool(ns.tls_key_file):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    if not is_loopback(host) and not ns.tls_cert_file and not ns.allow_insecure_remote:
        raise ValueError(f"--listen {ns.listen} is not a loopback address: give "
                         "--tls-cert-file and --tls-key-file (or --allow-insecure-remote "
                         "behind a TLS-terminating proxy)")
    if not ns.session_idle_timeout_s > 0:
        raise ValueError("--session-idle-timeout-s must be a positive number of seconds")
    return host, port


def run(ns: argparse.Namespace) -> int:
    try:
        import jinja2  # noqa: F401  (the [console] extra)
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    from ..cli import logs

    logs.setup(ns.log_format, ns.log_level)
    try:
        host, port = _listen(ns)
        for flag, path in (("--tls-cert-file", ns.tls_cert_file),
                           ("--tls-key-file", ns.tls_key_file)):
            if path and not os.path.isfile(path):
                raise ValueError(f"{flag} {path}: no such file")
        connection = connection_from_args(ns)
    except ValueError as exc:
        print(f"agenttx console: {exc}", file=sys.stderr)
        return 2
    if ns.token:
        print("agenttx console: --token / AGENTTX_TOKEN are not used: the console holds no "
              "credentials of its own; people sign in with their own tokens",
              file=sys.stderr)
        return 2
    from .app import Settings, build_app

    app, _ = build_app(Settings(target=connection["target"], tls=connection["tls"],
                                secure_cookie=bool(ns.tls_cert_file),
                                idle_s=ns.session_idle_timeout_s))
    scheme = "https" if ns.tls_cert_file else "http"
    import logging

    logging.getLogger(__name__).info(
        "agenttx console serving", extra={"url": f"{scheme}://{ns.listen}",
                                          "target": connection["target"]})
    options: dict[str, Any] = {}
    if ns.tls_cert_file:
        options.update(ssl_certfile=ns.tls_cert_file, ssl_keyfile=ns.tls_key_file)
    uvicorn.run(app, host=host, port=port, log_level=ns.log_level.lower(), access_log=False,
                lifespan="on", proxy_headers=False, server_header=False, **options)
    return 0


__all__ = ["DEFAULT_LISTEN", "INSTALL_HINT", "configure", "register", "run"]
