"""`agenttx serve | operator | bench | tx | mcp`.

Flags mirror the settings in config.py one to one (`--etcd-endpoints` <->
AGENTTX_ETCD_ENDPOINTS); a flag given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from pydantic import ValidationError

from .config import DefaultPolicy, Settings


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        if name == "default_policy":
            for sub, subfield in DefaultPolicy.model_fields.items():
                parser.add_argument(f"--default-policy-{sub.replace('_', '-')}",
                                    dest=f"default_policy__{sub}", default=None,
                                    help=f"{subfield.description} (env "
                                    f"AGENTTX_DEFAULT_POLICY__{sub.upper()}; default "
                                    f"{subfield.default})")
            continue
        default = field.default if field.default is not None else "unset"
        if name == "effect_channels":
            default = "{}"
        flag = f"--{name.replace('_', '-')}"
        help_text = f"{field.description} (env AGENTTX_{name.upper()}; default {default})"
        if field.annotation is bool:  # `--allow-unauthenticated` or `... false`
            parser.add_argument(flag, dest=name, default=None, nargs="?", const="true",
                                metavar="true|false", help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)


def settings_from_args(ns: argparse.Namespace) -> Settings:
    given: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    for key, value in vars(ns).items():
        if value is None or key in ("command", "func"):
            continue
        if key.startswith("default_policy__"):
            policy[key.split("__", 1)[1]] = value
        elif key in Settings.model_fields:
            given[key] = value
    settings = Settings(**given)
    if policy:
        merged = settings.default_policy.model_dump() | policy
        settings = settings.model_copy(update={"default_policy": DefaultPolicy(**merged)})
    return settings


def _serve(ns: argparse.Namespace) -> int:
    from . import logs
    from .server import serve

    try:
        settings = settings_from_args(ns)
    except (ValidationError, ValueError) as exc:
        print(f"agenttx serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logs.setup(settings.log_format, settings.log_level)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(settings.event_loop)) as runner:
            return runner.run(serve(settings))
    except ValueError as exc:  # e.g. a malformed AGENTTX_EFFECT_CHANNELS entry
        print(f"agenttx serve: invalid settings: {exc}", file=sys.stderr)
        return 2


def _loop_factory(name: str) -> Any:
    """uvloop when asked for and installed (measured faster: docs/benchmarks.md),
    else asyncio's own loop."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            return None
        return uvloop.new_event_loop
    return None


def _operator(argv: list[str]) -> int:
    from agenttx_operator.main import run

    return run(argv)


def _bench(argv: list[str]) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


def _tx(argv: list[str]) -> int:
    from .txcli import main as tx_main

    return tx_main(argv)


def _mcp(argv: list[str]) -> int:
    from .mcp_server import main as mcp_main

    return mcp_main(argv)


# Subcommands with their own parsers: everything after the name is theirs.
_DELEGATED = {"operator": _operator, "bench": _bench, "tx": _tx, "mcp": _mcp}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="agenttx", description="Transactions for AI agents' "
                                     "tool calls.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run the gRPC service")
    _add_settings_flags(serve_p)
    sub.add_parser("operator", help="run the AgentTxPolicy operator (flags: agenttx operator "
                   "--help)", add_help=False)
    sub.add_parser("bench", help="benchmark a running or embedded service", add_help=False)
    sub.add_parser("tx", help="list, show and roll back open transactions (agenttx tx --help)",
                   add_help=False)
    sub.add_parser("mcp", help="serve AgentTx tools over MCP, stdio or streamable HTTP "
                   "(agenttx mcp --help)", add_help=False)
    if argv and argv[0] in _DELEGATED:
        return _DELEGATED[argv[0]](argv[1:])
    ns = parser.parse_args(argv)
    return _serve(ns)


if __name__ == "__main__":
    sys.exit(main())
