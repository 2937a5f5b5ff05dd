"""`agenttx`: one command and one parser; each installed distribution adds its subcommands.

Why entry points: the client distribution (`agenttx-client`) owns the `agenttx` command
and its commands for people (`tx`, `mcp`, ...); the service distribution (`agenttx`)
adds `serve`, `operator` and `bench` when it is installed. With only the client
installed, `agenttx --help` lists the client's commands and `serve` is not among them.

A subcommand is an entry point in the group `agenttx.commands`: a callable
`register(subparsers)` that adds its parser with `subparsers.add_parser(name, ...)` and
sets `func` (namespace -> exit code) as the parser's default. Nothing here imports the
service: the two distributions meet only through this group.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

GROUP = "agenttx.commands"
# Shown in this order; anything else a plug-in registers follows, by name.
ORDER = ("serve", "operator", "tx", "approvals", "effects", "mcp", "console", "bench")


def _registrations() -> list[tuple[str, Callable[[argparse._SubParsersAction], None]]]:
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    names = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)
    return [(n, found[n].load()) for n in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agenttx", description="Transactions for AI agents' tool calls.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _name, register in _registrations():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    func: Callable[[argparse.Namespace], int] = ns.func
    return func(ns)


__all__ = ["GROUP", "build_parser", "main"]
