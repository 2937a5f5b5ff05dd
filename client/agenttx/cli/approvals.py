"""`agenttx approvals list [--json] | approve ID --digest D [--reason R] | reject ID
--reason R`: a person signs off what cannot be undone (docs/approvals.md).

Why: an agent's commit that would pay, mail or file a ticket stops at the approval gate;
a person must see exactly what it would do (the gated steps with their arguments, the
keys it writes) and decide, without writing code. Everything goes through the public
client (`agenttx.client`), like any other caller: `ListApprovals` (paged) and
`DecideApproval`; both need the approver or admin role once authentication is on.

`approve` needs the digest `list` shows: the service commits only if it is still the
digest of what is pending, so a person approves exactly what they saw. `reject` needs a
reason (rejecting is always safe: no digest); it goes into the transaction's history.

Exit codes (agenttx.cli.exits): 0 done (approved and committed, or rejected), 1 approved
but the commit was aborted by a conflict (compensated; see the history), 2 usage (one
line, never a traceback), 3 not found (unknown, already decided, or not yours to
decide), 4 permission denied (not an approver, or your own transaction: four eyes),
5 digest mismatch or not pending, 6 the service failed or could not be reached. Output
goes to stdout, errors to stderr, so `--json` can be piped as is.

It must never decide anything it was not asked to, and never retry a decision.
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
    Approval,
    Client,
    Decision,
    FailedPrecondition,
    TransactionStatus,
)
from ..client.cliargs import add_connection_arguments, connection_from_args
from . import exits

DEFAULT_PAGE_SIZE = 100
# Per gated step in the text view: arguments beyond this are cut ("…"); --json has them all.
ARGUMENTS_SHOWN_CHARS = 2000
WRITE_KEYS_SHOWN = 50


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints the usage and then the error; a usage error here is one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(exits.USAGE, f"{self.prog}: {message}\n")


def register(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx approvals` in the one `agenttx` parser (agenttx.cli)."""
    parser = subparsers.add_parser(
        "approvals", help="list, approve and reject transactions awaiting approval",
        description="Transactions whose commit needs a person's approval: see exactly what "
        "each would do, then approve it (naming its digest) or reject it (with a reason). "
        "Needs the approver or admin role once authentication is on.")
    parser.error = _OneLineParser.error.__get__(parser)  # type: ignore[method-assign]
    configure(parser)
    parser.set_defaults(func=lambda ns: run(ns))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sub", required=True, metavar="{list,approve,reject}",
                                parser_class=_OneLineParser)

    ls = sub.add_parser("list", help="pending approvals: the transaction, who began it, the "
                        "gated steps and their arguments, the keys written, the digest")
    ls.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    ls.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE,
                    help=f"approvals per ListApprovals call (default {DEFAULT_PAGE_SIZE})")
    add_connection_arguments(ls)

    approve = sub.add_parser("approve", help="commit a pending transaction now (needs the "
                             "digest `list` shows)")
    approve.add_argument("transaction_id", metavar="ID")
    approve.add_argument("--digest", required=True, metavar="D",
                         help="the digest of what you approve, as `list` shows it")
    approve.add_argument("--reason", default="", help="logged by the service")
    add_connection_arguments(approve)

    reject = sub.add_parser("reject", help="undo a pending transaction and end it as REJECTED")
    reject.add_argument("transaction_id", metavar="ID")
    reject.add_argument("--reason", required=True,
                        help="why (required; kept in the transaction's history)")
    add_connection_arguments(reject)


# ---- formatting ------------------------------------------------------------------------

def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def list_rows(approvals: Sequence[Approval]) -> list[dict[str, Any]]:
    """The `--json` shape: the RPC's fields, each gated step's arguments as JSON."""
    return [{"transaction_id": a.transaction_id, "principal": a.principal,
             "agent_id": a.agent_id, "digest": a.digest,
             "gated": [{"step_id": g.step_id, "tool": g.tool, "channel": g.channel,
                        "arguments": g.arguments} for g in a.gated],
             "write_keys": list(a.write_keys), "requested_at": a.requested_at,
             "expires_at": a.expires_at} for a in approvals]


def list_text(approvals: Sequence[Approval], now: float) -> str:
    """One block per approval: what a person needs to decide, and the command to do so."""
    blocks = []
    for a in approvals:
        lines = [f"transaction  {a.transaction_id}",
                 f"principal    {a.principal or '-'}",
                 f"agent        {a.agent_id or '-'}",
                 f"requested    {_when(a.requested_at)} ({_span(now - a.requested_at)} ago)",
                 f"expires      {_when(a.expires_at)} (in {_span(a.expires_at - now)})",
                 f"digest       {a.digest}",
                 "gated steps"]
        labels = [g.tool + (f" -> {g.channel}" if g.channel else "") for g in a.gated]
        width = max(map(len, labels), default=0)
        for g, label in zip(a.gated, labels, strict=True):
            lines.append(f"  step {g.step_id:<4} {label:<{width}}  "
                         f"{_clip(g.arguments_json, ARGUMENTS_SHOWN_CHARS)}")
        keys = list(a.write_keys)
        shown = ", ".join(keys[:WRITE_KEYS_SHOWN])
        more = f" and {len(keys) - WRITE_KEYS_SHOWN} more (--json)" \
            if len(keys) > WRITE_KEYS_SHOWN else ""
        lines.append(f"writes       {shown or '(none)'}{more}")
        lines.append(f"decide       agenttx approvals approve {a.transaction_id} "
                     f"--digest {a.digest}")
        lines.append(f"             agenttx approvals reject {a.transaction_id} "
                     "--reason '...'")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# ---- commands --------------------------------------------------------------------------

def _list(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    approvals = list(client.approvals(page_size=ns.page_size))
    if ns.json:
        json.dump(list_rows(approvals), out, indent=2, ensure_ascii=False)
        out.write("\n")
    elif approvals:
        print(list_text(approvals, time.time()), file=out)
    else:
        print("no pending approvals", file=out)
    return exits.OK


def _decided(tx: str, d: Decision, out: TextIO, err: TextIO) -> int:
    if d.status is TransactionStatus.COMMITTED:
        text = (f"approved transaction {tx}: committed {_n(d.steps_committed, 'step')}, "
                f"{_n(d.effects_dispatched, 'effect')} delivered")
        if d.dispatch_errors:
            text += ("; not delivered yet (retried in the background): "
                     + "; ".join(d.dispatch_errors))
        print(text, file=out)
        return exits.OK
    if d.status is TransactionStatus.REJECTED:
        print(f"rejected transaction {tx}: everything it did was undone", file=out)
        return exits.OK
    print(f"approved transaction {tx}, but its commit was aborted: another transaction "
          "committed a key it read or wrote since it asked for approval; everything it did "
          "was undone and it ended as ABORTED", file=err)
    return exits.INCOMPLETE


def _approve(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _decided(ns.transaction_id,
                    client.approve(ns.transaction_id, ns.digest, reason=ns.reason), out, err)


def _reject(client: Client, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return _decided(ns.transaction_id, client.reject(ns.transaction_id, ns.reason), out, err)


COMMANDS = {"list": _list, "approve": _approve, "reject": _reject}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """`agenttx approvals ARGV...` (for tests and scripts: `out` and `err` may be captured)."""
    from . import build_parser

    try:
        ns = build_parser().parse_args(["approvals", *(sys.argv[1:] if argv is None
                                                       else argv)])
    except SystemExit as exc:  # usage errors: already printed, one line
        return int(exc.code or 0)
    return run(ns, out=out, err=err)


def run(ns: argparse.Namespace, *, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    name = f"agenttx approvals {ns.sub}"
    if getattr(ns, "page_size", 1) < 1:
        print(f"{name}: --page-size must be at least 1", file=err)
        return exits.USAGE
    if ns.sub != "list" and not ns.transaction_id:
        print(f"{name}: ID must not be empty", file=err)
        return exits.USAGE
    if ns.sub == "approve" and not ns.digest.strip():
        print(f"{name}: --digest must be the digest `agenttx approvals list` shows", file=err)
        return exits.USAGE
    if ns.sub == "reject" and not ns.reason.strip():
        print(f"{name}: --reason must say why (it is kept in the history)", file=err)
        return exits.USAGE
    try:
        connection = connection_from_args(ns)
        client = Client(**connection)
    except (ValueError, OSError) as exc:
        print(f"{name}: {exc}", file=err)
        return exits.USAGE
    try:
        with client:
            return COMMANDS[ns.sub](client, ns, out, err)
    except FailedPrecondition as exc:
        print(f"{name}: {exc.details}", file=err)
        return exits.NOT_PENDING
    except AgentTxError as exc:
        code = exits.for_error(exc)
        where = f" (target {connection['target']})" if code == exits.SERVICE else ""
        what = exc.details if code in (exits.NOT_FOUND, exits.USAGE) else \
            f"{exc.code.name}: {exc.details}"
        print(f"{name}: {what}{where}", file=err)
        return code
