"""Print the transcript of docs/approvals.md by running it against a real service.

Why: what the docs show an approver and an agent must be what the service and the CLI
really print. This starts a real etcd and `agenttx serve` with token authentication and
an approval policy (`agenttx.testing.serve`), a loopback webhook standing in for a
payments provider, then plays the story: an agent's refund waits at the gate, an approver
lists it and approves it; a second one (a file, a ticket, a payment) is rejected and
undone; the agent's `tx.commit(wait_for_approval=...)` sees the decision; four eyes and a
wrong digest are refused. Paste the output into docs/approvals.md.

    .venv/bin/python scripts/approvals_transcript.py

Needs the example tools (`ticket.create`): `pip install -e examples/agenttx-example-tools`
(scripts/bootstrap.sh does).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from agenttx.auth import hash_token
from agenttx.testing import serve
from agenttx.testing.receivers import PostReceiver

TOKENS = {"AGENT": ("agent-t0ken", "billing-agent", "team-a", ["agent"]),
          "ALICE": ("alice-t0ken", "alice", "team-a", ["approver"]),
          "LEAD": ("lead-t0ken", "lead", "team-a", ["agent", "approver"])}
APPROVAL = {"required": [{"channel": "payments"}, {"tool": "ticket.*"}], "approvers": [],
            "timeoutSeconds": 86400, "notifyChannel": "approvals"}


def main() -> int:
    received: list[dict[str, Any]] = []

    def on_post(handler: BaseHTTPRequestHandler, body: bytes) -> int:
        received.append(json.loads(body))
        return 200

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="agenttx-approvals-docs-"))
    tokens = workdir / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"sha256": hash_token(t), "principal": p, "namespace": ns, "roles": r}
        for t, p, ns, r in TOKENS.values()]}))
    out: list[str] = []
    with PostReceiver(on_post, "/hooks", name="payments") as hooks:
        channels = {"payments": {"kind": "webhook", "url": hooks.url},
                    "approvals": {"kind": "log"}}
        env = {"AGENTTX_EFFECT_CHANNELS": json.dumps(channels),
               "AGENTTX_DEFAULT_POLICY__APPROVAL": json.dumps(APPROVAL)}
        with serve(env=env, extra_args=["--auth", "token", "--auth-tokens-file", str(tokens)],
                   workdir=workdir) as svc:
            cli_env = {**os.environ, "AGENTTX_TARGET": svc.target}

            def cli(who: str, *args: str) -> str:
                run = subprocess.run([sys.executable, "-m", "agenttx", *args], env={
                    **cli_env, "AGENTTX_TOKEN": TOKENS[who][0]}, capture_output=True,
                    text=True, timeout=120)
                shown = " ".join(a if re.fullmatch(r"[\w./:=-]+", a) else repr(a)
                                 for a in args)
                out.append(f"$ AGENTTX_TOKEN=${who} agenttx {shown}")
                text = (run.stdout + run.stderr).rstrip()
                if text:
                    out.append(text)
                if run.returncode:
                    out.append(f"(exit {run.returncode})")
                out.append("")
                return run.stdout

            def say(text: str) -> None:
                out.extend([f"# {text}", ""])

            with svc.client(token=TOKENS["AGENT"][0]) as agent:
                say("the agent refunds an order: a write and a payment")
                out.append(">>> tx = client.begin(agent_id='refund-bot')")
                tx = agent.begin(agent_id="refund-bot")
                tx.step("kv.put", {"key": "order-1042", "value": {"state": "refunded"}})
                tx.step("effect.stage", {"channel": "payments", "idempotency_key": "refund-1042",
                                         "payload": {"order": 1042, "amount_eur": 42.5}})
                out.append(">>> tx.step('kv.put', {'key': 'order-1042', 'value': "
                           "{'state': 'refunded'}})")
                out.append(">>> tx.step('effect.stage', {'channel': 'payments', "
                           "'idempotency_key': 'refund-1042', 'payload': {'order': 1042, "
                           "'amount_eur': 42.5}})")
                result = tx.commit()
                out.append(">>> tx.commit()")
                out.append(repr(result).replace(", history=None", ""))
                out.append(f"# payments received so far: {len(received)}")
                out.append("")

                say("an approver sees exactly what it would do")
                cli("ALICE", "approvals", "list")
                say("an agent may not decide; nor may anyone name another digest")
                cli("AGENT", "approvals", "approve", tx.id, "--digest", result.approval_digest)
                cli("ALICE", "approvals", "approve", tx.id, "--digest", "0" * 64)
                say("four eyes: `lead` is an approver, but not of what it began itself")
                with svc.client(token=TOKENS["LEAD"][0]) as lead:
                    own = lead.begin(agent_id="lead-console")
                    own.step("effect.stage", {"channel": "payments", "payload": {"order": 7}})
                    own_digest = own.commit().approval_digest
                    cli("LEAD", "approvals", "approve", own.id, "--digest", own_digest)
                    lead.rollback(own.id, reason="withdrawn")
                out.append(f"# (lead withdrew {own.id}: RollbackTransaction)")
                out.append("")
                say("alice approves what she saw")
                cli("ALICE", "approvals", "approve", tx.id, "--digest",
                    result.approval_digest, "--reason", "refund checked against the order")
                out.append(f"# payments received: {json.dumps(received)}")
                out.append("")
                cli("AGENT", "tx", "show", tx.id)

                say("a second one waits, and the agent waits for the decision")
                second = agent.begin(agent_id="refund-bot")
                second.step("fs.write", {"path": "refund-1043.txt", "contents": "refund 1043"})
                second.step("ticket.create", {"id": "REF-1043", "title": "refund order 1043"})
                second.step("effect.stage", {"channel": "payments",
                                             "idempotency_key": "refund-1043",
                                             "payload": {"order": 1043, "amount_eur": 990}})
                waited: dict[str, Any] = {}
                waiter = threading.Thread(target=lambda: waited.update(
                    r=second.commit(wait_for_approval=60)))
                waiter.start()
                out.append(">>> result = tx.commit(wait_for_approval=60)   # in the agent")
                out.append("")
                shown = ""
                while second.id not in shown:
                    shown = subprocess.run(
                        [sys.executable, "-m", "agenttx", "approvals", "list"],
                        env={**cli_env, "AGENTTX_TOKEN": TOKENS["ALICE"][0]},
                        capture_output=True, text=True, timeout=120).stdout
                cli("ALICE", "approvals", "list")
                cli("ALICE", "approvals", "reject", second.id, "--reason",
                    "amount above the refund limit")
                waiter.join(60)
                r = waited["r"]
                out.append(">>> result.status, result.history.ended_by, "
                           "result.history.reason")
                out.append(repr((r.status, r.history.ended_by, r.history.reason)))
                tickets = svc.fs_root / "tickets"
                out.append(f"# refund-1043.txt exists: {(svc.fs_root / 'refund-1043.txt').exists()}"
                           f"; tickets: {sorted(p.name for p in tickets.glob('*'))}"
                           f"; payments received: {len(received)}")
                out.append("")
                cli("AGENT", "tx", "show", second.id)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
