"""Approvals of toolset calls (docs/approvals.md, docs/toolsets.md): two real replicas on a
real etcd, the team's real MCP servers on loopback (tests/support/mcp_upstreams.py: a
ticket tracker and a mailer, built with the official SDK), declared with
`--toolsets-file`; the default policy gates every `mail.*` tool and the tracker's
`create_ticket`.

What is pinned, where a user would see it: a deferred `mail.send_email` is not called at
step time nor at the gate; the approval lists it with its resolved arguments; approved
(on the other replica), the mailer gets exactly one call with the staged idempotency
key; rejected, the mailer never hears of it and the ticket the saga step opened at once
is closed exactly once, and the transaction's write is not committed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agenttx.client import Client, TransactionStatus
from agenttx.testing import ServiceProcess
from support.mcp_upstreams import Upstreams, declaration, mailer, ticket, tracker
from support.waiting import eventually, slack

POLL_S = 0.2             # --effect-poll-s: a decided commit's calls leave within a poll
APPROVAL = {"required": [{"tool": "mail.*"}, {"tool": "tickets.create_ticket"}],
            "approvers": [], "timeoutSeconds": 3600, "notifyChannel": ""}


@dataclass
class Pair:
    a: ServiceProcess
    b: ServiceProcess


@pytest.fixture(scope="module")
def ups() -> Iterator[Upstreams]:
    with tracker() as t, mailer() as m:
        yield Upstreams(t, m)


@pytest.fixture(scope="module")
def pair(etcd, scratch, sandbox, ups) -> Iterator[Pair]:
    prefix = f"/agenttx-apts-{uuid.uuid4().hex[:8]}"
    path = scratch / f"toolsets-approvals-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(declaration(ups)))
    procs = [ServiceProcess(name, etcd_endpoints=etcd.endpoints, prefix=prefix,
                            fs_root=str(sandbox), workdir=scratch / "approvals-toolsets",
                            env={"AGENTTX_EFFECT_POLL_S": str(POLL_S),
                                 "AGENTTX_DEFAULT_POLICY__APPROVAL": json.dumps(APPROVAL)},
                            extra_args=["--toolsets-file", str(path)])
             for name in ("apts-a", "apts-b")]
    for p in procs:
        p.start()
    yield Pair(procs[0], procs[1])
    for p in procs:
        p.stop()


def _pending(client: Client, tx_id: str):
    return next((a for a in client.approvals() if a.transaction_id == tx_id), None)


def test_an_approved_deferred_call_is_made_once_with_its_staged_key(pair, ups):
    subject = f"refund {uuid.uuid4().hex[:8]}"
    with pair.a.client() as agent, pair.b.client() as approver:
        tx = agent.begin(agent_id="mailer-bot")
        staged = tx.step("mail.send_email", {"to": "customer@example.com",
                                             "subject": subject, "body": "refunded"})
        assert staged.ok and staged.output["deferred"] is True
        key = staged.output["idempotency_key"]
        result = tx.commit()
        assert (result.committed, result.awaiting_approval, result.status) == \
            (False, True, TransactionStatus.AWAITING_APPROVAL)
        assert ups.mailer.calls_to("send_email", subject=subject) == []  # held at the gate

        approval = _pending(approver, tx.id)
        assert approval is not None and approval.digest == result.approval_digest
        [gated] = approval.gated
        assert (gated.step_id, gated.tool, gated.channel) == (1, "mail.send_email", "")
        assert gated.arguments == {"to": "customer@example.com", "subject": subject,
                                   "body": "refunded"}

        decision = approver.approve(tx.id, approval.digest, reason="checked")
        assert (decision.status, decision.steps_committed) == (TransactionStatus.COMMITTED, 1)
        [sent] = eventually(lambda: ups.mailer.calls_to("send_email", subject=subject),
                            slack(POLL_S * 5), "the approved mail is sent")
        assert sent.key == key
        assert sent.arguments == {"to": "customer@example.com", "subject": subject,
                                  "body": "refunded"}
        assert agent.history(tx.id).status is TransactionStatus.COMMITTED
        assert _pending(approver, tx.id) is None
    # exactly once: the commit's own delivery and the dispatcher never both send it
    assert len(ups.mailer.calls_to("send_email", subject=subject)) == 1


def test_a_rejected_transaction_never_calls_the_mailer_and_closes_its_ticket(pair, ups):
    subject = f"never {uuid.uuid4().hex[:8]}"
    key = f"order-{uuid.uuid4().hex[:8]}"
    with pair.a.client() as agent, pair.b.client() as approver:
        tx = agent.begin(agent_id="mailer-bot")
        tx.step("kv.put", {"key": key, "value": "refunded"})
        made = tx.step("tickets.create_ticket", {"title": f"refund {subject}"})
        assert made.ok
        ticket_id = made.output["id"]
        assert ticket(ups.tracker, ticket_id)["status"] == "open"  # a saga acts at once
        tx.step("mail.send_email", {"to": "customer@example.com", "subject": subject})
        result = tx.commit()
        assert result.awaiting_approval

        approval = _pending(approver, tx.id)
        assert approval is not None
        assert [(g.step_id, g.tool) for g in approval.gated] == \
            [(2, "tickets.create_ticket"), (3, "mail.send_email")]
        assert approval.write_keys == (f"kv:{key}",)

        decision = approver.reject(tx.id, "amount above the limit")
        assert decision.status is TransactionStatus.REJECTED
        history = agent.history(tx.id)
        assert (history.status, history.reason) == \
            (TransactionStatus.REJECTED, "amount above the limit")
        # undone before the decision answered: the ticket is closed, once
        [close] = ups.tracker.calls_to("close_ticket", id=ticket_id)
        assert close.arguments == {"id": ticket_id, "reason": "rolled back by AgentTx"}
        assert ticket(ups.tracker, ticket_id)["status"] == "closed"
        # the write was never committed
        probe = agent.begin(agent_id="probe")
        read = probe.step("kv.get", {"key": key})
        assert (read.ok, read.category) == (False, "no_data_found")
        probe.rollback()
    assert ups.mailer.calls_to("send_email", subject=subject) == []
