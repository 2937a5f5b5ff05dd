"""`agenttx effects dead [--json] | retry KEY | discard KEY --reason R`: dead letters, for
people.

Why: an effect its receiver refused for good (an HTTP 4xx, an SMTP 5xx, a payload the
channel cannot encode) is not retried by the service; it waits as a dead letter until an
admin looks at it, fixes whatever was wrong (the receiver, its config, the data) and sends
it again, or decides it must not be sent and drops it with a reason for the audit log
(docs/operations.md, "Dead letters"). Everything goes through the public client
(`agenttx.client`), like any other caller: `ListDeadLetters` (paged),
`RetryDeadLetter`, `DiscardDeadLetter`; all three need the admin role once
authentication is on.

Exit codes: 0 done, 2 usage (one line on stderr, never a traceback), 3 not found,
4 permission denied (or unauthenticated), 1 any other service error (unreachable, a
letter held by several principals without `--principal`, ...). Tables go to stdout,
errors to stderr, so `--json` output can be piped as is.

It must never retry or discard anything it was not asked to, and never retry a call.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from ..client import (
    AgentTxError,
    Client,
    DeadLetter,
    InvalidArgument,
    NotFound,
)
from ..client.cliargs import add_connection_arguments, connection_from_args
from . import exits

EXIT_OK, EXIT_USAGE, EXIT_NOT_FOUND = exits.OK, exits.USAGE, exits.NOT_FOUND
DEFAULT_PAGE_SIZE = 500


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage and then the error; a usage error here is one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n")


def register(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx effects` in the one `agenttx` parser (agenttx.cli)."""
    parser = subparsers.add_parser(
        "effects", help="list, retry and discard dead letters (refused effects)",
        description="Effects their receivers refused for good (dead letters): list them, "
        "send one again, or drop one with a reason. Needs the admin role once "
        "authentication is on.")
    parser.error = _OneLineParser.error.__get__(parser)  # type: ignore[method-assign]
    configure(parser)
    parser.set_defaults(func=lambda ns: run(ns))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sub", required=True, metavar="{dead,retry,discard}",
                                parser_class=_OneLineParser)

    dead = sub.add_parser("dead", help="the dead letters: key, principal, kind, channel, "
                          "attempts, age, transaction, last error")
    dead.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    dead.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE,
                      help=f"dead letters per ListDeadLetters call (default {DEFAULT_PAGE_SIZE})")
    add_connection_arguments(dead)

    retry = sub.add_parser("retry", help="send a dead letter again (same idempotency key)")
    retry.add_argument("key", metavar="KEY", help="its idempotency key")
    retry.add_argument("--principal", default="",
                       help="whose dead letter, when several principals have one with KEY")
    retry.add_argument("--reason", default="agenttx effects retry",
                       help="logged by the service")
    add_connection_arguments(retry)

    discard = sub.add_parser("discard", help="drop a dead letter for good, with a reason")
    discard.add_argument("key", metavar="KEY", help="its idempotency key")
    discard.add_argument("--reason", required=True,
                         help="why it is dropped (required; goes into the audit log)")
    discard.add_argument("--principal", default="",
                         help="whose dead letter, when several principals have one with KEY")
    add_connection_arguments(discard)


# ---- formatting ------------------------------------------------------------------------

def _printable(text: str) -> str:
    """Keys and principals as a terminal may show them: as they are when printable ASCII,
    else JSON-quoted (a key from before keys were checked may hold invisible or
    direction-changing characters)."""
    return text if text and all(" " < ch <= "~" for ch in text) else json.dumps(text)


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def dead_rows(letters: Sequence[DeadLetter]) -> list[dict[str, Any]]:
    """The `--json` shape: one object per dead letter, the RPC's fields."""
    return [{"idempotency_key": d.idempotency_key, "principal": d.principal,
             "transaction_id": d.transaction_id, "kind": d.kind, "channel": d.channel,
             "attempts": d.attempts, "dead_at": d.dead_at, "last_error": d.last_error}
            for d in letters]


def dead_table(letters: Sequence[DeadLetter], now: float) -> str:
    header = ("IDEMPOTENCY KEY", "PRINCIPAL", "KIND", "CHANNEL", "ATTEMPTS", "DEAD FOR",
              "TRANSACTION", "LAST ERROR")
    cells = [(_printable(d.idempotency_key), _printable(d.principal) if d.principal else "-",
              d.kind or "-", d.channel or "-", str(d.attempts),
              _age(now - d.dead_at) if d.dead_at > 0 else "-", d.transaction_id or "-",
              " ".join(d.last_error.split()) or "-") for d in letters]
    widths = [max(len(c[i]) for c in (header, *cells)) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in (header, *cells))


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---- commands --------------------------------------------------------------------------

def _dead(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    letters = list(client.dead_letters(page_size=ns.page_size))
    if ns.json:
        json.dump(dead_rows(letters), out, indent=2)
        out.write("\n")
    elif letters:
        print(dead_table(letters, time.time()), file=out)
    else:
        print("no dead letters", file=out)
    return EXIT_OK


def _retry(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client.retry_dead_letter(ns.key, principal=ns.principal, reason=ns.reason)
    print(f"dead letter {_printable(ns.key)} is back in the outbox with the same idempotency "
          "key; the dispatcher sends it within its poll interval", file=out)
    return EXIT_OK


def _discard(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    client.discard_dead_letter(ns.key, ns.reason, principal=ns.principal)
    print(f"dead letter {_printable(ns.key)} discarded at {_when(time.time())}; it will not "
          "be sent (the key stays reserved for the retention window)", file=out)
    return EXIT_OK


COMMANDS = {"dead": _dead, "retry": _retry, "discard": _discard}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """`agenttx effects ARGV...` (for tests and scripts: `out` and `err` may be captured)."""
    from . import build_parser

    try:
        ns = build_parser().parse_args(["effects", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exc:  # usage errors: already printed, one line
        return int(exc.code or 0)
    return run(ns, out=out, err=err)


def run(ns: argparse.Namespace, *, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    name = f"agenttx effects {ns.sub}"
    if getattr(ns, "page_size", 1) < 1:
        print(f"{name}: --page-size must be at least 1", file=err)
        return EXIT_USAGE
    if ns.sub in ("retry", "discard") and not ns.key:
        print(f"{name}: KEY must not be empty", file=err)
        return EXIT_USAGE
    if ns.sub == "discard" and not ns.reason.strip():
        print(f"{name}: --reason must say why the effect is dropped", file=err)
        return EXIT_USAGE
    try:
        connection = connection_from_args(ns)
        client = Client(**connection)
    except (ValueError, OSError) as exc:
        print(f"{name}: {exc}", file=err)
        return EXIT_USAGE
    try:
        with client:
            return COMMANDS[ns.sub](client, ns, out, err)
    except NotFound as exc:
        print(f"{name}: {exc.details}", file=err)
        return EXIT_NOT_FOUND
    except InvalidArgument as exc:
        print(f"{name}: {exc.details}", file=err)
        return EXIT_USAGE
    except AgentTxError as exc:
        print(f"{name}: {exc.code.name}: {exc.details} (target {connection['target']})",
              file=err)
        return exits.for_error(exc)
