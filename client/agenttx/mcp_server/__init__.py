"""`agenttx mcp`: AgentTx as an MCP server, on the official `mcp` Python SDK (docs/mcp.md).

    agenttx mcp --target 127.0.0.1:50051                       # stdio (default)
    agenttx mcp --transport http --listen 127.0.0.1:8000       # http://127.0.0.1:8000/mcp
    agenttx mcp --transport http --listen 0.0.0.0:8000 --require-auth

Every AgentTx tool (built-ins, installed plug-ins, toolsets in scope) is an MCP tool named
without dots (`kv_put`, `record_insert`, `ticket_create`, ...), plus `agenttx_begin`,
`agenttx_commit`, `agenttx_rollback` and `agenttx_status`; see `catalog` (what is offered)
and `bridge` (how calls become steps). The service is reached through `agenttx.client`
(`--target`, env `AGENTTX_TARGET`; `--token` / `AGENTTX_TOKEN`; `--tls*`).

Over HTTP, `--require-auth` makes every request carry `Authorization: Bearer <token>`
(else HTTP 401) and forwards that token to the service as the caller's own credentials;
off loopback it is required (the server refuses to start without it), so the server
never lends its own credentials to whoever can reach it.

Named `mcp_server`, not `mcp`: a package `agenttx.mcp` would make `import mcp` inside it
ambiguous to readers and tools, and a top-level `mcp.py` would shadow the SDK. This
process never forks a gRPC-holding child (gRPC + fork with `preexec_fn` aborts): it
spawns nothing at all. Logs go to stderr (on stdio, stdout is the protocol). A closing
session rolls back its transaction at once; on stdin's end, or SIGTERM/SIGINT, it
aborts every transaction its sessions still hold.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..client.cliargs import add_connection_arguments, connection_from_args

if TYPE_CHECKING:
    from .bridge import Bridge, Settings

log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """`Bridge` and `Settings` load the MCP SDK (about a second of imports) on first use:
    every `agenttx` command registers its parser through this package, and none but
    `agenttx mcp` should pay for the SDK (`agenttx serve` must refuse a busy data dir
    within seconds)."""
    if name in ("Bridge", "Settings"):
        from . import bridge

        return getattr(bridge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

DEFAULT_LISTEN = "127.0.0.1:8000"
HTTP_PATH = "/mcp"
# An HTTP session with no request in flight and no open stream for this long is closed
# (its client went away without DELETE), and its transaction rolled back with it.
DEFAULT_SESSION_IDLE_S = 300.0


def register(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx mcp` in the one `agenttx` parser (agenttx.cli)."""
    parser = subparsers.add_parser(
        "mcp", help="serve AgentTx tools over MCP (stdio or streamable HTTP)",
        description="Serve AgentTx tools and transactions over MCP.")
    configure(parser)
    parser.set_defaults(func=run)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                        help="stdio (default) or streamable HTTP")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"--transport http: address to serve http://HOST:PORT{HTTP_PATH} "
                        f"on (default {DEFAULT_LISTEN})")
    parser.add_argument("--agent-id", default=os.environ.get("AGENTTX_MCP_AGENT_ID", "agenttx-mcp"),
                        help="agent_id of the transactions begun for MCP clients (env "
                        "AGENTTX_MCP_AGENT_ID; default agenttx-mcp); it selects the policy")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                        help="metadata of every transaction begun (repeatable)")
    parser.add_argument("--require-auth", action="store_true",
                        help="--transport http: every request must carry 'Authorization: "
                        "Bearer <token>' (else HTTP 401); the token is forwarded to the "
                        "service as the caller's credentials (required off loopback)")
    parser.add_argument("--session-idle-timeout-s", type=float, default=DEFAULT_SESSION_IDLE_S,
                        metavar="SECONDS",
                        help="--transport http: close a session with no request in flight and "
                        "no open stream for this long (its client went away) and roll back its "
                        f"transaction (default {DEFAULT_SESSION_IDLE_S:g})")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("json", "text"), default="text")
    add_connection_arguments(parser)


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RequireBearer:
    """ASGI middleware: a request without `Authorization: Bearer <token>` gets HTTP 401;
    one with a token is marked as that credential's (so the SDK ties each session to the
    credential that opened it) and passed on. The token itself is checked by the
    service, on every call the bridge makes with it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from .bridge import bearer_token

        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        token = bearer_token(headers)
        if token is None:
            body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32001, "message": "missing credentials: send 'Authorization: Bearer "
                                           "<token>' with every request"}}).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        who = hashlib.sha256(token.encode()).hexdigest()[:32]
        scope = {**scope, "user": AuthenticatedUser(AccessToken(token=token, client_id=who,
                                                                scopes=[]))}
        await self.app(scope, receive, send)


async def _serve_stdio(bridge: Bridge) -> None:
    from mcp.server.stdio import stdio_server

    from .bridge import CLOSE_TIMEOUT_S

    server = bridge.server()
    async with anyio.create_task_group() as tg:
        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    # The SDK reads stdin in a worker thread that no cancellation can
                    # interrupt, so a signal cannot unwind the server: abort the open
                    # transactions here, then die of the signal (as uvicorn does on HTTP).
                    with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                        await bridge.close()
                    log.info("agenttx mcp stopped", extra={"signal": signal.Signals(signum).name})
                    logging.shutdown()
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

        tg.start_soon(stop_on_signal)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        tg.cancel_scope.cancel()  # stdin closed: the normal end


async def _serve_http(bridge: Bridge, host: str, port: int, log_level: str,
                      session_idle_s: float) -> None:
    import uvicorn

    app: Any = bridge.server().streamable_http_app(streamable_http_path=HTTP_PATH, host=host,
                                                   session_idle_timeout=session_idle_s)
    if bridge.settings.require_auth:
        app = RequireBearer(app)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(),
                            lifespan="on", access_log=False)
    log.info("agenttx mcp serving streamable HTTP",
             extra={"url": f"http://{host}:{port}{HTTP_PATH}", "target": bridge.settings.target,
                    "require_auth": bridge.settings.require_auth})
    await uvicorn.Server(config).serve()


def main(argv: Sequence[str] | None = None) -> int:
    """`agenttx mcp ARGV...`."""
    from ..cli import build_parser

    return run(build_parser().parse_args(["mcp", *(sys.argv[1:] if argv is None else argv)]))


def run(ns: argparse.Namespace) -> int:
    from ..cli import logs
    from .bridge import Bridge, Settings

    logs.setup(ns.log_format, ns.log_level)
    try:
        connection = connection_from_args(ns)
        if any("=" not in item for item in ns.metadata):
            raise ValueError("--metadata takes KEY=VALUE")
        metadata = dict(item.split("=", 1) for item in ns.metadata)
        listen = _split_listen(ns.listen) if ns.transport == "http" else None
        if listen is None and ns.require_auth:
            raise ValueError("--require-auth applies to --transport http (over stdio the "
                             "credentials are --token / AGENTTX_TOKEN)")
        if listen is not None and not is_loopback(listen[0]) and not ns.require_auth:
            raise ValueError(f"--listen {ns.listen} is not a loopback address: add "
                             "--require-auth, so every request carries its caller's own "
                             "bearer token")
        if not ns.session_idle_timeout_s > 0:
            raise ValueError("--session-idle-timeout-s must be a positive number of seconds")
    except ValueError as exc:
        print(f"agenttx mcp: {exc}", file=sys.stderr)
        return 2
    bridge = Bridge(Settings(target=connection["target"], token=connection["token"],
                             tls=connection["tls"], agent_id=ns.agent_id, metadata=metadata,
                             require_auth=ns.require_auth))
    if listen is None:
        anyio.run(_serve_stdio, bridge)
    else:
        anyio.run(_serve_http, bridge, *listen, ns.log_level, ns.session_idle_timeout_s)
    return 0


__all__ = ["Bridge", "RequireBearer", "Settings", "configure", "is_loopback", "main",
           "register", "run"]
