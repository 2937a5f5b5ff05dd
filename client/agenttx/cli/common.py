"""What the `agenttx` commands for people (`tx`, `approvals`, `effects`) share, so they
read alike and cannot drift: one-line usage errors, times and ages, cut texts, tables,
and running a subcommand against the service with one mapping from errors to exit codes
(agenttx.cli.exits) and one wording of them on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TextIO

from ..client import AgentTxError, Client
from ..client.cliargs import connection_from_args
from . import exits

Command = Callable[[Client, argparse.Namespace, TextIO, TextIO], int]


class OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage and then the error; a usage error here is one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(exits.USAGE, f"{self.prog}: {message}\n")


def one_line_usage_errors(parser: argparse.ArgumentParser) -> None:
    """Make `parser` (made by the shared `agenttx` tree) report usage errors in one line."""
    parser.error = OneLineParser.error.__get__(parser)  # type: ignore[method-assign]


def utc(ts: float, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime(fmt)


def age(seconds: float | None) -> str:
    """A duration as people read it: 42s, 3m05s, 2h07m, 1d04h ("-" when unknown)."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clip(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters ending with "…" when longer."""
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def table(header: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, each as wide as its widest cell."""
    widths = [max(len(c[i]) for c in (header, *cells)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in (header, *cells))


def run_with_client(name: str, ns: argparse.Namespace, commands: Mapping[str, Command],
                    out: TextIO | None, err: TextIO | None, *,
                    special: Mapping[type[AgentTxError], int] | None = None) -> int:
    """Connect as the flags in `ns` say, run `commands[ns.sub]`, and turn what went wrong
    into one line on stderr and its exit code: bad connection flags → usage; a not found
    or refused value → its details; a denial → its code and details; a failed or
    unreachable service → its code, details and the target. `special` maps error types a
    command gives a meaning of its own (e.g. not pending) to their exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        connection: dict[str, Any] = connection_from_args(ns)
        client = Client(**connection)
    except (ValueError, OSError) as exc:
        print(f"{name}: {exc}", file=err)
        return exits.USAGE
    try:
        with client:
            return commands[ns.sub](client, ns, out, err)
    except AgentTxError as exc:
        for kind, code in (special or {}).items():
            if isinstance(exc, kind):
                print(f"{name}: {exc.details}", file=err)
                return code
        code = exits.for_error(exc)
        where = f" (target {connection['target']})" if code == exits.SERVICE else ""
        what = exc.details if code in (exits.NOT_FOUND, exits.USAGE) else \
            f"{exc.code.name}: {exc.details}"
        print(f"{name}: {what}{where}", file=err)
        return code


__all__ = ["Command", "OneLineParser", "age", "clip", "one_line_usage_errors", "run_with_client",
           "table", "utc"]
