"""`agenttx mcp`: AgentTx as an MCP server, on the official `mcp` Python SDK (SPEC §10).

    agenttx mcp --target 127.0.0.1:50051                       # stdio (default)
    agenttx mcp --transport http --listen 127.0.0.1:8000       # http://127.0.0.1:8000/mcp

Every AgentTx tool (built-ins and installed plug-ins) is an MCP tool named without dots
(`kv_put`, `record_insert`, `ticket_create`, ...), plus `agenttx_begin`, `agenttx_commit`,
`agenttx_rollback` and `agenttx_status`; see `catalog` (what is offered) and `bridge`
(how calls become steps). The service is reached through `agenttx.client` (`--target`,
env `AGENTTX_TARGET`; `--token` / `AGENTTX_TOKEN`; `--tls*`).

Named `mcp_server`, not `mcp`: a package `agenttx.mcp` would make `import mcp` inside it
ambiguous to readers and tools, and a top-level `mcp.py` would shadow the SDK. This
process never forks a gRPC-holding child (gRPC + fork with `preexec_fn` aborts): it
spawns nothing at all. Logs go to stderr (on stdio, stdout is the protocol). On stdin's
end, or SIGTERM/SIGINT, it aborts the transactions its sessions still hold.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("json", "text"), default="text")
    add_connection_arguments(parser)


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


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


async def _serve_http(bridge: Bridge, host: str, port: int, log_level: str) -> None:
    import uvicorn

    app = bridge.server().streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(),
                            lifespan="on", access_log=False)
    log.info("agenttx mcp serving streamable HTTP",
             extra={"url": f"http://{host}:{port}{HTTP_PATH}", "target": bridge.settings.target})
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
    except ValueError as exc:
        print(f"agenttx mcp: {exc}", file=sys.stderr)
        return 2
    bridge = Bridge(Settings(target=connection["target"], token=connection["token"],
                             tls=connection["tls"], agent_id=ns.agent_id, metadata=metadata))
    if listen is None:
        anyio.run(_serve_stdio, bridge)
    else:
        anyio.run(_serve_http, bridge, *listen, ns.log_level)
    return 0


__all__ = ["Bridge", "Settings", "configure", "main", "register", "run"]
