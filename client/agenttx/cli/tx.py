"""`agenttx tx list | show ID | rollback ID [--to-step K]`: open transactions, for people.

Why: an operator must be able to see what agents left open and resolve a transaction
stuck waiting for a manual rollback (an undo that failed, SPEC §5.5) without writing
code. Everything goes through the public client (`agenttx.client`), like any other
caller: `ListTransactions` (paged), `GetTransaction`, `RollbackTransaction`.

Exit codes (pinned, SPEC §10.1): 0 done, 1 rollback incomplete (the compensation errors
on stderr), 2 usage (bad flags, an out-of-range --to-step), 3 not found; 4 for any other
service error (unreachable, unauthenticated, ...). Tables go to stdout, progress and
errors to stderr, so `--json` output can be piped as is.

It must never roll back anything it was not asked to, and never retry a rollback.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from ..client import (
    AgentTxError,
    Client,
    InvalidArgument,
    NotFound,
    TransactionState,
    TransactionStatus,
    TransactionSummary,
)
from ..client.cliargs import add_connection_arguments, connection_from_args

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_ERROR = 0, 1, 2, 3, 4
DEFAULT_PAGE_SIZE = 500
CONTEXT_SHOWN_CHARS = 200


def register(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx tx` in the one `agenttx` parser (agenttx.cli)."""
    parser = subparsers.add_parser(
        "tx", help="list, show and roll back transactions",
        description="Inspect and resolve open AgentTx transactions.")
    configure(parser)
    parser.set_defaults(func=lambda ns: run(ns))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sub", required=True, metavar="{list,show,rollback}")

    ls = sub.add_parser("list", help="open transactions: id, principal, agent, status, next "
                        "step, age")
    ls.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    ls.add_argument("--status", type=str.upper, default=None,
                    choices=[TransactionStatus.ACTIVE.value,
                             TransactionStatus.AWAITING_ROLLBACK.value],
                    help="only transactions in this status (default: every open one)")
    ls.add_argument("--agent-prefix", default="", metavar="PREFIX",
                    help="only agents whose id starts with PREFIX")
    ls.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE,
                    help=f"transactions per ListTransactions call (default {DEFAULT_PAGE_SIZE})")
    add_connection_arguments(ls)

    show = sub.add_parser("show", help="one transaction: status, next step, constraints, "
                          "context log")
    show.add_argument("transaction_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print the full view as JSON")
    add_connection_arguments(show)

    rb = sub.add_parser("rollback", help="undo a transaction (abort), or its steps >= K")
    rb.add_argument("transaction_id", metavar="ID")
    rb.add_argument("--to-step", type=int, default=None, metavar="K",
                    help="undo the live steps >= K and keep the transaction open at step K "
                    "(default: abort it, undoing everything)")
    rb.add_argument("--reason", default="agenttx tx rollback", help="logged by the service")
    add_connection_arguments(rb)


# ---- formatting ------------------------------------------------------------------------

def format_age(seconds: float | None) -> str:
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


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _age_s(created_at: float, now: float) -> float | None:
    return round(max(0.0, now - created_at), 1) if created_at > 0 else None


def _when(ts: float, now: float) -> str:
    stamp = datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({format_age(now - ts)} ago)"


def list_rows(rows: Sequence[TransactionSummary], now: float) -> list[dict[str, Any]]:
    """The `--json` shape (SPEC §10.1)."""
    return [{"transaction_id": r.transaction_id, "status": r.status.value,
             "agent_id": r.agent_id, "principal": r.principal,
             "next_step_id": r.next_step_id, "age_s": _age_s(r.created_at, now)}
            for r in rows]


def list_table(rows: Sequence[TransactionSummary], now: float) -> str:
    header = ("TRANSACTION", "PRINCIPAL", "AGENT", "STATUS", "NEXT", "AGE")
    cells = [(r.transaction_id, r.principal or "-", r.agent_id or "-", r.status.value,
              str(r.next_step_id), format_age(_age_s(r.created_at, now))) for r in rows]
    widths = [max(len(c[i]) for c in (header, *cells)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in (header, *cells)]
    return "\n".join(lines)


def show_text(v: TransactionState, now: float) -> str:
    lines = [f"transaction    {v.transaction_id}",
             f"status         {v.status.value}",
             f"agent          {v.agent_id or '-'}",
             f"principal      {v.principal or '-'}",
             f"next step      {v.next_step_id}",
             f"global resets  {v.global_resets}"]
    if v.created_at > 0:
        lines.append(f"created        {_when(v.created_at, now)}")
    if v.updated_at > 0:
        lines.append(f"updated        {_when(v.updated_at, now)}")
    if v.status is TransactionStatus.AWAITING_ROLLBACK:
        lines.append("               an undo failed: steps and commit are refused until "
                     f"`agenttx tx rollback {v.transaction_id}` succeeds")
    lines.append("constraints" + ("    (none)" if not v.constraints else ""))
    lines += [f"  - {c}" for c in v.constraints]
    lines.append("context" + ("        (none)" if not v.context else ""))
    width = max((len(c.tool_name) for c in v.context), default=0)
    for c in v.context:
        text = c.raw_context.replace("\n", " ")
        if len(text) > CONTEXT_SHOWN_CHARS:
            text = text[:CONTEXT_SHOWN_CHARS] + "…"
        lines.append(f"  step {c.step_id:<4} {c.tool_name:<{width}}  {text}")
    return "\n".join(lines)


def show_json(v: TransactionState) -> dict[str, Any]:
    return {"transaction_id": v.transaction_id, "status": v.status.value,
            "agent_id": v.agent_id, "principal": v.principal, "next_step_id": v.next_step_id,
            "global_resets": v.global_resets, "constraints": list(v.constraints),
            "context": [{"step_id": c.step_id, "tool_name": c.tool_name,
                         "raw_context": c.raw_context} for c in v.context],
            "created_at": v.created_at, "updated_at": v.updated_at}


# ---- commands --------------------------------------------------------------------------

def _list(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    rows: list[TransactionSummary] = []
    token = ""
    while True:
        page = client.list_page(page_size=ns.page_size, page_token=token, status=ns.status,
                                agent_id_prefix=ns.agent_prefix)
        rows.extend(page.transactions)
        token = page.next_page_token
        if not token:
            break
        print(f"agenttx tx list: {len(rows)} transactions so far, reading the next page…",
              file=err, flush=True)
    now = time.time()
    rows.sort(key=lambda r: (r.created_at, r.transaction_id))
    if ns.json:
        json.dump(list_rows(rows, now), out, indent=2)
        out.write("\n")
    elif rows:
        print(list_table(rows, now), file=out)
    else:
        print("no open transactions", file=out)
    return EXIT_OK


def _show(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    view = client.get(ns.transaction_id)
    if ns.json:
        json.dump(show_json(view), out, indent=2)
        out.write("\n")
    else:
        print(show_text(view, time.time()), file=out)
    return EXIT_OK


def _rollback(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    result = client.rollback(ns.transaction_id, ns.to_step, reason=ns.reason)
    tx = ns.transaction_id
    if not result.rolled_back:
        print(f"agenttx tx rollback: rollback of {tx} is incomplete "
              f"({_n(result.compensations_run, 'undo action')} ran); the transaction waits for "
              "another rollback, which resumes where this one stopped. Failed:", file=err)
        for e in result.compensation_errors:
            print(f"  - {e}", file=err)
        return EXIT_INCOMPLETE
    if ns.to_step:
        print(f"rolled back transaction {tx} to before step {ns.to_step}: "
              f"{_n(result.compensations_run, 'undo action')}; next step {result.next_step_id}",
              file=out)
    else:
        print(f"aborted transaction {tx}: {_n(result.compensations_run, 'undo action')}",
              file=out)
    return EXIT_OK


COMMANDS = {"list": _list, "show": _show, "rollback": _rollback}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """`agenttx tx ARGV...` (for tests and scripts: `out` and `err` may be captured)."""
    from . import build_parser

    ns = build_parser().parse_args(["tx", *(sys.argv[1:] if argv is None else argv)])
    return run(ns, out=out, err=err)


def run(ns: argparse.Namespace, *, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    if getattr(ns, "page_size", 1) < 1:
        print("agenttx tx list: --page-size must be at least 1", file=err)
        return EXIT_USAGE
    try:
        connection = connection_from_args(ns)
        client = Client(**connection)
    except (ValueError, OSError) as exc:
        print(f"agenttx tx {ns.sub}: {exc}", file=err)
        return EXIT_USAGE
    try:
        with client:
            return COMMANDS[ns.sub](client, ns, out, err)
    except NotFound as exc:
        print(f"agenttx tx {ns.sub}: {exc.details}", file=err)
        return EXIT_NOT_FOUND
    except InvalidArgument as exc:
        print(f"agenttx tx {ns.sub}: {exc.details}", file=err)
        return EXIT_USAGE
    except AgentTxError as exc:
        print(f"agenttx tx {ns.sub}: {exc.code.name}: {exc.details} "
              f"(target {connection['target']})", file=err)
        return EXIT_ERROR
