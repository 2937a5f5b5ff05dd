"""`agenttx tx list | show ID | rollback ID [--to-step K]`: transactions, for people.

Why: an operator (or the agent's author) must be able to see what agents left open, what
happened to a transaction that ended, and resolve one stuck waiting for a manual
rollback (an undo that failed, docs/recovery.md), without writing code. Everything goes
through the public client (`agenttx.client`), like any other caller: `ListTransactions`
(paged), `GetTransactionHistory` and `GetTransaction`, `RollbackTransaction`.

Exit codes (agenttx.cli.exits, docs/client.md): 0 done, 1 rollback incomplete (the
compensation errors on stderr), 2 usage (bad flags, an out-of-range or negative
--to-step; one line), 3 not found, 4 permission denied, 6 the service failed or could
not be reached. Tables go to stdout, progress and errors to stderr, so `--json` output
can be piped as is. Never a traceback.

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
    HistoryStep,
    NotFound,
    TransactionHistory,
    TransactionState,
    TransactionStatus,
    TransactionSummary,
)
from ..client.cliargs import add_connection_arguments, connection_from_args
from . import exits

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_NOT_FOUND = exits.OK, exits.INCOMPLETE, \
    exits.USAGE, exits.NOT_FOUND
DEFAULT_PAGE_SIZE = 500
CONTEXT_SHOWN_CHARS = 200
# Columns of the steps table; --json has the full texts (up to 4096 bytes each).
ARGUMENTS_SHOWN_CHARS = 60
RESULT_SHOWN_CHARS = 120


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
                             TransactionStatus.AWAITING_ROLLBACK.value,
                             TransactionStatus.AWAITING_APPROVAL.value],
                    help="only transactions in this status (default: every open one)")
    ls.add_argument("--agent-prefix", default="", metavar="PREFIX",
                    help="only agents whose id starts with PREFIX")
    ls.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE,
                    help=f"transactions per ListTransactions call (default {DEFAULT_PAGE_SIZE})")
    add_connection_arguments(ls)

    show = sub.add_parser("show", help="one transaction, open or ended: how it stands or "
                          "how it ended, and every step sent")
    show.add_argument("transaction_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print the full history as JSON")
    add_connection_arguments(show)

    rb = sub.add_parser("rollback", help="undo a transaction (abort), or its steps >= K")
    rb.add_argument("transaction_id", metavar="ID")
    rb.add_argument("--to-step", default=None, metavar="K",
                    help="undo the live steps >= K (K >= 1) and keep the transaction open at "
                    "step K (default, or 0: abort it, undoing everything)")
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


def _clip(text: str, limit: int) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _result(step: HistoryStep) -> str:
    if step.ok:
        return _clip(step.output_json, RESULT_SHOWN_CHARS)
    return f"{step.category}: {step.hint}"


def steps_table(steps: Sequence[HistoryStep]) -> list[str]:
    header = ("STEP", "TOOL", "STATUS", "STRATEGY", "AT", "ARGUMENTS", "RESULT")
    cells = [(str(s.step_id), s.tool, s.status.value, s.strategy.value,
              datetime.datetime.fromtimestamp(s.at, datetime.UTC).strftime("%H:%M:%S"),
              _clip(s.arguments_json, ARGUMENTS_SHOWN_CHARS), _result(s)) for s in steps]
    widths = [max(len(c[i]) for c in (header, *cells)) for i in range(len(header) - 1)]
    return ["  " + "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                             row[-1]]).rstrip()
            for row in (header, *cells)]


def show_text(h: TransactionHistory, v: TransactionState | None, now: float) -> str:
    """The history's header, the live state of an open transaction, then the steps."""
    lines = [f"transaction    {h.transaction_id}",
             f"status         {h.status.value}",
             f"agent          {h.agent_id or '-'}",
             f"principal      {h.principal or '-'}"]
    if h.created_at > 0:
        lines.append(f"created        {_when(h.created_at, now)}")
    if h.ended:
        lines.append(f"ended          {_when(h.ended_at, now)} by {h.ended_by or '-'}")
        if h.reason:
            lines.append(f"reason         {h.reason}")
        if h.status is TransactionStatus.COMMITTED:
            lines.append(f"committed      {_n(h.steps_committed, 'step')}, "
                         f"{_n(h.effects, 'effect')}")
    if v is not None:
        lines += [f"next step      {v.next_step_id}",
                  f"global resets  {v.global_resets}"]
        if v.updated_at > 0:
            lines.append(f"updated        {_when(v.updated_at, now)}")
        if v.status is TransactionStatus.AWAITING_ROLLBACK:
            lines.append("               an undo failed: steps and commit are refused until "
                         f"`agenttx tx rollback {v.transaction_id}` succeeds")
        if v.status is TransactionStatus.AWAITING_APPROVAL:
            lines.append("               its commit awaits a person's approval: "
                         "`agenttx approvals list` shows what it would do")
        lines.append("constraints" + ("    (none)" if not v.constraints else ""))
        lines += [f"  - {c}" for c in v.constraints]
        lines.append("context" + ("        (none)" if not v.context else ""))
        width = max((len(c.tool_name) for c in v.context), default=0)
        for c in v.context:
            text = _clip(c.raw_context, CONTEXT_SHOWN_CHARS + 1)
            lines.append(f"  step {c.step_id:<4} {c.tool_name:<{width}}  {text}")
    lines.append("steps" + ("          (none sent)" if not h.steps else ""))
    if h.steps:
        lines += steps_table(h.steps)
    return "\n".join(lines)


def show_json(h: TransactionHistory, v: TransactionState | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "transaction_id": h.transaction_id, "status": h.status.value, "agent_id": h.agent_id,
        "principal": h.principal, "created_at": h.created_at, "ended_at": h.ended_at,
        "ended_by": h.ended_by, "reason": h.reason, "steps_committed": h.steps_committed,
        "effects": h.effects,
        "steps": [{"step_id": s.step_id, "tool": s.tool, "status": s.status.value,
                   "error_category": s.category, "clean_hint": s.hint,
                   "strategy": s.strategy.value, "at": s.at,
                   "arguments_json": s.arguments_json, "output_json": s.output_json}
                  for s in h.steps]}
    if v is not None:
        doc.update({"next_step_id": v.next_step_id, "global_resets": v.global_resets,
                    "constraints": list(v.constraints),
                    "context": [{"step_id": c.step_id, "tool_name": c.tool_name,
                                 "raw_context": c.raw_context} for c in v.context],
                    "updated_at": v.updated_at})
    return doc


def to_step_value(text: str | None) -> int | None:
    """--to-step: None or an integer >= 0 (0 aborts, as in the API); else a usage error."""
    if text is None:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"--to-step must be an integer >= 1 (or 0 to abort), not {text!r}")
    return value


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
    history = client.history(ns.transaction_id)
    view: TransactionState | None = None
    if not history.ended:
        try:
            view = client.get(ns.transaction_id)
        except NotFound:  # it ended since: show it as the history has it
            history = client.history(ns.transaction_id)
    if ns.json:
        json.dump(show_json(history, view), out, indent=2)
        out.write("\n")
    else:
        print(show_text(history, view, time.time()), file=out)
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
        if ns.sub == "rollback":
            ns.to_step = to_step_value(ns.to_step)
        connection = connection_from_args(ns)
        client = Client(**connection)
    except (ValueError, OSError) as exc:
        print(f"agenttx tx {ns.sub}: {exc}", file=err)
        return EXIT_USAGE
    try:
        with client:
            return COMMANDS[ns.sub](client, ns, out, err)
    except AgentTxError as exc:
        code = exits.for_error(exc)
        where = f" (target {connection['target']})" if code == exits.SERVICE else ""
        what = exc.details if code in (exits.NOT_FOUND, exits.USAGE) else \
            f"{exc.code.name}: {exc.details}"
        print(f"agenttx tx {ns.sub}: {what}{where}", file=err)
        return code
