"""Approvals end to end (docs/approvals.md): two real replicas with token authentication,
a real etcd, a real loopback webhook receiver, the real `ticket.create` saga plug-in.

Who is who (the token file): `billing-agent` (namespace team-a, role agent) begins the
transactions; `alice` and `bob` are team-a's approvers; `lead` is an agent of team-a who
is also an approver (four eyes: never of its own transactions); `carol` an agent without
the role; `mallory` an approver of team-b; `root` an admin of the service namespace.

What needs approval (the default policy, AGENTTX_DEFAULT_POLICY__APPROVAL): an effect on
the `payments` channel and any `ticket.*` step; `approvals` (a webhook channel) is told
when one starts waiting. Two AgentTxPolicies are published into etcd the way the
operator does: `quick-*` agents wait at most 5 s for a decision, `idle-*` agents are idle
after 2 s.

What is pinned: a commit stops at the gate (nothing delivered, nothing committed, steps
and commits refused, the transaction and its history say AWAITING_APPROVAL, the notify
event sent once); ListApprovals shows exactly the gated steps (arguments resolved), the
written keys and the digest the commit answered; approving with that digest commits
and delivers once, with anything else changes nothing; rejecting undoes files, sagas and
data and ends REJECTED with the reason; the owner may withdraw; four eyes and scope; two
racing decisions, exactly one winner; a conflicting commit in between aborts the
approval (compensated); expiry by the reaper; the idle reaper leaves it alone; a replica
killed right before or right after the decision's etcd transaction never delivers twice;
the CLI and MCP surfaces.

Deadlines come from the settings given to the replicas: the dispatcher's poll and claim,
the reaper's interval (a tenth of --tx-idle-timeout-s), the policies' timeouts.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from prometheus_client.parser import text_string_to_metric_families

from agenttx.auth import hash_token
from agenttx.client import (
    AgentTxError,
    AsyncClient,
    Client,
    FailedPrecondition,
    GatedStep,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TransactionStatus,
    Unavailable,
)
from agenttx.contracts.layout import Keys
from agenttx.contracts.policy import PublishedPolicy, approval_from_spec, policy_to_json
from agenttx.embedded_etcd import free_port
from agenttx.store.client import connect
from agenttx.testing import ServiceProcess
from support.receivers import WebhookReceiver
from support.waiting import eventually, eventually_async, slack

POLL_S = 0.2            # --effect-poll-s
CLAIM_S = 2.0           # --effect-claim-s: a dead replica's deliveries are retried after it
IDLE_S = 30             # --tx-idle-timeout-s: the reaper sweeps every IDLE_S / 10
SWEEP_S = IDLE_S / 10
QUICK_TIMEOUT_S = 5     # approval.timeoutSeconds of the `quick-` policy
IDLE_POLICY_S = 2       # idleTimeoutSeconds of the `idle-` policy
SERVICE_NS = "agenttx"

TOKENS = {
    "agent-t0ken": ("billing-agent", "team-a", ["agent"]),
    "alice-t0ken": ("alice", "team-a", ["approver"]),
    "bob-t0ken": ("bob", "team-a", ["approver"]),
    "lead-t0ken": ("lead", "team-a", ["agent", "approver"]),
    "carol-t0ken": ("carol", "team-a", ["agent"]),
    "mallory-t0ken": ("mallory", "team-b", ["approver"]),
    "root-t0ken": ("root", SERVICE_NS, ["admin"]),
}
DEFAULT_APPROVAL = {"required": [{"channel": "payments"}, {"tool": "ticket.*"}],
                    "approvers": [], "timeoutSeconds": 3600, "notifyChannel": "approvals"}


@dataclass
class Deployment:
    replicas: tuple[ServiceProcess, ServiceProcess]
    metrics: tuple[str, str]
    keys: Keys
    hooks: WebhookReceiver
    fs_root: pathlib.Path
    env: dict[str, str]
    args: list[str]
    workdir: pathlib.Path
    endpoints: list[str]

    def client(self, who: str, replica: int = 0) -> Client:
        return self.replicas[replica].client(token=f"{who}-t0ken")

    def async_client(self, who: str, replica: int = 0) -> AsyncClient:
        return self.replicas[replica].async_client(token=f"{who}-t0ken")

    def scrape(self) -> list[dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        out = []
        for url in self.metrics:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
            out.append({(s.name, tuple(sorted(s.labels.items()))): s.value
                        for f in text_string_to_metric_families(text) for s in f.samples})
        return out

    def gauge(self, name: str) -> float:
        """max over the replicas: only the reaper leader reports it."""
        return max(s.get((name, ()), 0.0) for s in self.scrape())

    def outbox_round_trips(self) -> float:
        key = ("agenttx_etcd_requests_total", (("operation", "outbox"),))
        return sum(s.get(key, 0.0) for s in self.scrape())

    def after_more_sweeps(self, sweeps: int = 3) -> None:
        """Wait until the dispatcher leader has scanned the outbox `sweeps` more times
        (each scan is at least two etcd round trips: the outbox page and the dead
        letters' count), so "never delivered again" is read after it had every chance."""
        start = self.outbox_round_trips()
        eventually(lambda: self.outbox_round_trips() >= start + 2 * sweeps,
                   slack(sweeps * POLL_S + CLAIM_S), f"{sweeps} more dispatcher sweeps")

    def decisions(self, decision: str) -> float:
        key = ("agenttx_approval_decisions_total", (("decision", decision),))
        return sum(s.get(key, 0.0) for s in self.scrape())

    def extra_replica(self, name: str, env: dict[str, str]) -> ServiceProcess:
        """One more replica of this deployment (same etcd prefix and flags)."""
        return ServiceProcess(name, etcd_endpoints=self.endpoints, prefix=self.keys.prefix,
                              fs_root=str(self.fs_root), workdir=self.workdir,
                              env={**self.env, **env}, extra_args=self.args).start()


def deliveries(hooks: WebhookReceiver, key: str) -> int:
    return hooks.keys()[key]


async def _publish(endpoints: list[str], keys: Keys, policies: list[PublishedPolicy]) -> None:
    store = connect(endpoints)
    try:
        for p in policies:  # what the operator writes for an AgentTxPolicy
            await store.put(keys.policy(p.namespace, p.name), policy_to_json(p), what="publish")
    finally:
        await store.close()


@pytest.fixture(scope="module")
def deployment(etcd, scratch) -> Iterator[Deployment]:
    root = pathlib.Path(scratch) / f"approvals-{uuid.uuid4().hex[:6]}"
    root.mkdir(parents=True)
    fs_root = root / "sandbox"
    fs_root.mkdir()
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"sha256": hash_token(t), "principal": p, "namespace": ns, "roles": r}
        for t, (p, ns, r) in TOKENS.items()]}))
    keys = Keys(f"/agenttx-approvals-{uuid.uuid4().hex[:6]}")
    asyncio.run(_publish(etcd.endpoints, keys, [
        PublishedPolicy(SERVICE_NS, "quick", 1, 10, agent_id_prefix="quick-",
                        approval=approval_from_spec({"timeoutSeconds": QUICK_TIMEOUT_S})),
        PublishedPolicy(SERVICE_NS, "idle", 1, 10, agent_id_prefix="idle-",
                        idle_timeout_s=IDLE_POLICY_S)]))
    with WebhookReceiver() as hooks:
        channels = {"payments": {"kind": "webhook", "url": hooks.url, "timeout_s": 2},
                    "approvals": {"kind": "webhook", "url": hooks.url, "timeout_s": 2},
                    "audit": {"kind": "log"}}
        env = {"AGENTTX_EFFECT_CHANNELS": json.dumps(channels),
               "AGENTTX_DEFAULT_POLICY__APPROVAL": json.dumps(DEFAULT_APPROVAL)}
        args = ["--auth", "token", "--auth-tokens-file", str(tokens),
                "--service-namespace", SERVICE_NS, "--effect-poll-s", str(POLL_S),
                "--effect-claim-s", str(CLAIM_S), "--leader-ttl-s", "2",
                "--tx-idle-timeout-s", str(IDLE_S)]
        ports = (free_port(), free_port())
        procs = [ServiceProcess(f"approvals-{i}", etcd_endpoints=etcd.endpoints,
                                prefix=keys.prefix, fs_root=str(fs_root), workdir=root, env=env,
                                extra_args=[*args, "--metrics-listen", f"127.0.0.1:{ports[i]}"])
                 for i in range(2)]
        for p in procs:
            p.start()
        try:
            yield Deployment((procs[0], procs[1]),
                             (f"http://127.0.0.1:{ports[0]}/metrics",
                              f"http://127.0.0.1:{ports[1]}/metrics"),
                             keys, hooks, fs_root, env, args, root, list(etcd.endpoints))
        finally:
            for p in procs:
                p.stop()


@pytest.fixture
def dep(deployment: Deployment) -> Iterator[Deployment]:
    """The deployment; afterwards nothing a test left waiting for approval stays pending
    (so the gauges other tests read start from zero)."""
    yield deployment
    with deployment.client("root") as root:
        for a in list(root.approvals()):
            try:
                root.reject(a.transaction_id, "test cleanup")
            except (NotFound, FailedPrecondition):
                pass  # decided meanwhile


@pytest.fixture
def agent(deployment: Deployment) -> Iterator[Client]:
    with deployment.client("agent") as c:
        yield c


@pytest.fixture
def alice(deployment: Deployment) -> Iterator[Client]:
    with deployment.client("alice", 1) as c:
        yield c


@pytest.fixture
def bob(deployment: Deployment) -> Iterator[Client]:
    with deployment.client("bob", 0) as c:
        yield c


@pytest.fixture
def root(deployment: Deployment) -> Iterator[Client]:
    with deployment.client("root", 1) as c:
        yield c


def committed(client: Client, key: str) -> Any:
    """The committed value of kv `key` (None when absent), read in a throwaway transaction."""
    tx = client.begin(agent_id="reader")
    r = tx.step("kv.get", {"key": key})
    tx.rollback()
    return r.output["value"] if r.ok else None


def pending(client: Client, tx_id: str) -> Any:
    found = [a for a in client.approvals() if a.transaction_id == tx_id]
    return found[0] if found else None


def payment(tx: Any, key: str, amount: int = 10) -> None:
    r = tx.step("effect.stage", {"channel": "payments", "payload": {"amount": amount,
                                                                     "order": key},
                                 "idempotency_key": key})
    assert r.ok, (r.category, r.hint)


def notifications(hooks: WebhookReceiver, tx_id: str) -> list[dict[str, Any]]:
    return [json.loads(r["body"]) for r in list(hooks.requests)
            if r["headers"].get("Idempotency-Key") == f"approval-requested-{tx_id}"]


# ---- the gate -------------------------------------------------------------------------------

def test_a_payment_waits_at_the_gate_and_is_delivered_once_when_approved(dep, agent, alice,
                                                                        root, uniq):
    key = f"pay-{uniq}"
    tx = agent.begin(agent_id="refund-bot")
    assert tx.step("kv.put", {"key": f"order-{uniq}", "value": {"state": "refunded"}}).ok
    payment(tx, key, 42)
    before = time.time()
    result = tx.commit()
    assert (result.committed, result.awaiting_approval, result.status) == (
        False, True, TransactionStatus.AWAITING_APPROVAL)
    assert len(result.approval_digest) == 64 and int(result.approval_digest, 16) >= 0
    assert (result.steps_committed, result.effects_dispatched) == (0, 0)
    # nothing left yet: no payment, no data; the transaction and its history say why
    assert deliveries(dep.hooks, key) == 0
    assert committed(agent, f"order-{uniq}") is None
    assert agent.get(tx.id).status is TransactionStatus.AWAITING_APPROVAL
    assert agent.history(tx.id).status is TransactionStatus.AWAITING_APPROVAL
    # the approvers see exactly what they approve
    shown = pending(alice, tx.id)
    assert shown is not None and shown == pending(root, tx.id)
    assert (shown.principal, shown.agent_id, shown.digest) == ("billing-agent", "refund-bot",
                                                              result.approval_digest)
    assert shown.gated == (GatedStep(2, "effect.stage", "payments",
                                     json.dumps({"amount": 42, "order": key},
                                                separators=(",", ":"))),)
    assert shown.write_keys == (f"kv:order-{uniq}",)
    assert before <= shown.requested_at <= time.time()
    assert shown.expires_at - shown.requested_at == pytest.approx(3600)
    # the notify channel was told, once, with the documented fields
    event = eventually(lambda: notifications(dep.hooks, tx.id), slack(POLL_S), "notified")
    assert event == [{"channel": "approvals", "idempotency_key": f"approval-requested-{tx.id}",
                      "transaction_id": tx.id, "payload": {
                          "event": "approval.requested", "transaction_id": tx.id,
                          "principal": "billing-agent", "agent_id": "refund-bot",
                          "digest": result.approval_digest,
                          "gated": [{"step_id": 2, "tool": "effect.stage",
                                     "channel": "payments"}],
                          "expires_at": shown.expires_at}}]
    decision = alice.approve(tx.id, result.approval_digest, reason="refund checked")
    assert (decision.status, decision.steps_committed, decision.effects_dispatched,
            decision.dispatch_errors) == (TransactionStatus.COMMITTED, 2, 1, ())
    assert deliveries(dep.hooks, key) == 1
    assert committed(agent, f"order-{uniq}") == {"state": "refunded"}
    h = agent.history(tx.id)
    assert (h.status, h.ended_by, h.reason, h.steps_committed, h.effects) == (
        TransactionStatus.COMMITTED, "alice", "", 2, 1)
    assert pending(root, tx.id) is None
    with pytest.raises(NotFound):
        agent.get(tx.id)
    # decided once, delivered once: the dispatcher never sends it again
    dep.after_more_sweeps()
    assert deliveries(dep.hooks, key) == 1
    assert len(notifications(dep.hooks, tx.id)) == 1
    # the audit line: who decided what, and how it ended
    lines = [r for r in dep.replicas[1].logs()
             if r.get("rpc") == "DecideApproval" and r.get("tx") == tx.id]
    assert [(r["principal"], r["decision"], r["code"], r["outcome"], r["audit"])
            for r in lines] == [("alice", "approve", "OK", "COMMITTED", True)]


def test_a_transaction_awaiting_approval_refuses_steps_and_commits_everywhere(dep, agent,
                                                                             uniq):
    tx = agent.begin()
    payment(tx, f"pay-{uniq}")
    digest = tx.commit().approval_digest
    for replica in (0, 1):
        with dep.client("agent", replica) as c:
            again = c.attach(tx.id, next_step_id=2)
            with pytest.raises(FailedPrecondition) as step:
                again.step("kv.put", {"key": f"more-{uniq}", "value": 1})
            assert f"transaction {tx.id} awaits approval (digest {digest})" in step.value.details
            with pytest.raises(FailedPrecondition, match="awaits approval"):
                again.commit()
    with pytest.raises(FailedPrecondition, match="roll it back entirely"):
        agent.rollback(tx.id, to_step=1)
    assert agent.get(tx.id).status is TransactionStatus.AWAITING_APPROVAL


def test_a_rejection_undoes_files_sagas_and_data_and_delivers_nothing(dep, agent, bob, uniq):
    notes = dep.fs_root / f"notes-{uniq}.txt"
    notes.write_text("before")
    tx = agent.begin(agent_id="support-bot")
    assert tx.step("fs.write", {"path": notes.name, "contents": "after"}).ok
    assert tx.step("kv.put", {"key": f"t-{uniq}", "value": f"T-{uniq}"}).ok
    made = tx.step("ticket.create", {"id": "${steps.2.value}", "title": "refund"})
    assert made.ok
    ticket = dep.fs_root / "tickets" / f"T-{uniq}.json"
    assert ticket.exists()
    payment(tx, f"pay-{uniq}")
    result: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: result.update(
        r=tx.commit(wait_for_approval=slack(10))))
    waiter.start()
    shown = eventually(lambda: pending(bob, tx.id), slack(2), "pending")
    # the saga's arguments as it was called: the reference resolved
    assert [(g.step_id, g.tool, g.channel, g.arguments) for g in shown.gated] == [
        (3, "ticket.create", "", {"id": f"T-{uniq}", "title": "refund"}),
        (4, "effect.stage", "payments", {"amount": 10, "order": f"pay-{uniq}"})]
    assert shown.write_keys == (f"kv:t-{uniq}",)
    decision = bob.reject(tx.id, "not this customer")
    assert decision.status is TransactionStatus.REJECTED
    waiter.join(slack(10))
    waited = result["r"]
    assert (waited.committed, waited.awaiting_approval, waited.status) == (
        False, False, TransactionStatus.REJECTED)
    assert waited.approval_digest == shown.digest
    assert (waited.history.ended_by, waited.history.reason) == ("bob", "not this customer")
    assert notes.read_text() == "before"
    assert not ticket.exists()
    assert committed(agent, f"t-{uniq}") is None
    assert deliveries(dep.hooks, f"pay-{uniq}") == 0
    h = agent.history(tx.id)
    assert (h.status, h.ended_by, h.reason, h.steps_committed) == (
        TransactionStatus.REJECTED, "bob", "not this customer", 0)


def test_the_owner_may_withdraw_its_request(dep, agent, alice, uniq):
    tx = agent.begin()
    assert tx.step("fs.write", {"path": f"w-{uniq}.txt", "contents": "x"}).ok
    payment(tx, f"pay-{uniq}")
    digest = tx.commit().approval_digest
    withdrawn = dep.decisions("withdrawn")
    done = agent.rollback(tx.id, reason="customer cancelled")
    assert (done.rolled_back, done.compensations_run) == (True, 2)
    assert not (dep.fs_root / f"w-{uniq}.txt").exists()
    assert pending(alice, tx.id) is None
    with pytest.raises(NotFound):
        alice.approve(tx.id, digest)
    h = agent.history(tx.id)
    assert (h.status, h.ended_by, h.reason) == (TransactionStatus.ABORTED, "billing-agent",
                                                "customer cancelled")
    assert dep.decisions("withdrawn") == withdrawn + 1
    assert deliveries(dep.hooks, f"pay-{uniq}") == 0


def test_nothing_gated_commits_as_usual(dep, agent, uniq):
    tx = agent.begin()
    assert tx.step("kv.put", {"key": f"plain-{uniq}", "value": 1}).ok
    assert tx.step("effect.stage", {"channel": "audit", "payload": {"x": 1}}).ok
    done = tx.commit()
    assert (done.committed, done.awaiting_approval, done.approval_digest, done.status) == (
        True, False, "", TransactionStatus.COMMITTED)


# ---- digest, four eyes, scope ---------------------------------------------------------------

def test_a_wrong_digest_changes_nothing(dep, agent, alice, uniq):
    tx = agent.begin()
    payment(tx, f"pay-{uniq}")
    digest = tx.commit().approval_digest
    wrong = ("0" if digest[0] != "0" else "1") + digest[1:]
    with pytest.raises(FailedPrecondition) as err:
        alice.approve(tx.id, wrong)
    assert err.value.details == (
        f"the digest does not match what transaction {tx.id} awaits approval for (a person "
        "approves exactly what they saw): list the approvals again; nothing was changed")
    with pytest.raises(InvalidArgument, match="64 lowercase hex digits"):
        alice.approve(tx.id, digest.upper())
    assert pending(alice, tx.id).digest == digest
    assert agent.get(tx.id).status is TransactionStatus.AWAITING_APPROVAL
    assert deliveries(dep.hooks, f"pay-{uniq}") == 0
    assert alice.approve(tx.id, digest).status is TransactionStatus.COMMITTED


def test_four_eyes_roles_and_scope_decide_who_may_decide(dep, uniq):
    with dep.client("lead") as lead, dep.client("carol") as carol, \
            dep.client("mallory") as mallory, dep.client("root") as root:
        tx = lead.begin()
        payment(tx, f"pay-{uniq}")
        digest = tx.commit().approval_digest
        # the principal that began it, although an approver: four eyes
        with pytest.raises(PermissionDenied) as own:
            lead.approve(tx.id, digest)
        assert own.value.details == (f"four eyes: lead began transaction {tx.id} and cannot "
                                     "decide its own approval; another approver must")
        with pytest.raises(PermissionDenied, match="four eyes"):
            lead.reject(tx.id, "mine")
        # an agent without the role
        for call in (lambda: carol.approve(tx.id, digest), lambda: carol.approvals_page()):
            with pytest.raises(PermissionDenied, match="needs the approver or admin role"):
                call()
        # an approver of another namespace: the approval does not exist for it
        assert pending(mallory, tx.id) is None
        with pytest.raises(NotFound):
            mallory.approve(tx.id, digest)
        # the lead sees its team's approvals (it is an approver), an admin sees all
        assert pending(lead, tx.id) is not None and pending(root, tx.id) is not None
        assert root.approve(tx.id, digest).status is TransactionStatus.COMMITTED
        assert lead.history(tx.id).ended_by == "root"
        assert deliveries(dep.hooks, f"pay-{uniq}") == 1


def test_unknown_and_undecidable_transactions_are_not_found(dep, agent, alice, uniq):
    with pytest.raises(NotFound):
        alice.approve(str(uuid.uuid4()), "a" * 64)
    with pytest.raises(NotFound):
        alice.reject("not-a-transaction", "why")
    tx = agent.begin()  # open, but nothing asked for approval
    assert tx.step("kv.put", {"key": f"k-{uniq}", "value": 1}).ok
    with pytest.raises(FailedPrecondition, match=f"transaction {tx.id} is ACTIVE, not awaiting "
                                                 "approval"):
        alice.reject(tx.id, "no")
    tx.rollback()


def test_approvals_are_listed_a_page_at_a_time(dep, agent, root, uniq):
    ids = []
    for i in range(3):
        tx = agent.begin(agent_id=f"pager-{uniq}")
        payment(tx, f"pay-{uniq}-{i}")
        tx.commit()
        ids.append(tx.id)
    seen, token, pages = [], "", 0
    while True:
        page = root.approvals_page(page_size=1, page_token=token)
        pages += 1
        assert len(page.approvals) <= 1
        seen += [a.transaction_id for a in page.approvals]
        token = page.next_page_token
        if not token:
            break
    assert sorted(i for i in seen if i in ids) == sorted(ids) and pages >= 3
    for tx_id in ids:
        root.reject(tx_id, "paging test")


# ---- races, conflicts, expiry ---------------------------------------------------------------

def race(dep: Deployment, tx_id: str, digest: str, second_approves: bool) -> dict[str, Any]:
    """alice approves on one replica while bob approves or rejects on the other, both
    released at once; what each got (a status, or the error)."""
    barrier = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def decide(who: str, replica: int, approve: bool) -> None:
        with dep.client(who, replica) as c:
            barrier.wait()
            try:
                outcomes[who] = (c.approve(tx_id, digest) if approve
                                 else c.reject(tx_id, "raced")).status
            except AgentTxError as err:
                outcomes[who] = err

    threads = [threading.Thread(target=decide, args=("alice", 0, True)),
               threading.Thread(target=decide, args=("bob", 1, second_approves))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(slack(10))
    return outcomes


@pytest.mark.parametrize("second", ["approve", "reject"])
def test_of_two_racing_decisions_exactly_one_wins(dep, agent, uniq, second):
    for round_ in range(3):
        key = f"race-{uniq}-{round_}"
        tx = agent.begin()
        payment(tx, key)
        digest = tx.commit().approval_digest
        outcomes = race(dep, tx.id, digest, second == "approve")
        won = {who: o for who, o in outcomes.items() if isinstance(o, TransactionStatus)}
        lost = {who: o for who, o in outcomes.items() if isinstance(o, AgentTxError)}
        assert len(won) == 1 and len(lost) == 1, outcomes
        (loser,) = lost.values()
        assert isinstance(loser, FailedPrecondition | NotFound), loser
        (winner, status) = next(iter(won.items()))
        h = agent.history(tx.id)
        assert (h.status, h.ended_by) == (status, winner)
        expected = 1 if status is TransactionStatus.COMMITTED else 0
        assert deliveries(dep.hooks, key) == expected
    # never twice, once the dispatcher had every chance
    dep.after_more_sweeps()
    assert all(n <= 1 for k, n in dep.hooks.keys().items() if k.startswith(f"race-{uniq}"))


def test_a_conflicting_commit_before_the_decision_aborts_the_approval(dep, agent, alice, uniq):
    account = f"account-{uniq}"
    setup = agent.begin()
    assert setup.step("kv.put", {"key": account, "value": 100}).ok
    setup.commit()
    tx = agent.begin(agent_id="refund-bot")
    assert tx.step("kv.get", {"key": account}).ok
    assert tx.step("kv.put", {"key": account, "value": 58}).ok
    assert tx.step("fs.write", {"path": f"receipt-{uniq}.txt", "contents": "42"}).ok
    payment(tx, f"pay-{uniq}", 42)
    digest = tx.commit().approval_digest
    other = agent.begin(agent_id="deposit-bot")       # commits the same key meanwhile
    assert other.step("kv.put", {"key": account, "value": 150}).ok
    assert other.commit().committed
    conflicts = dep.decisions("conflict")
    decision = alice.approve(tx.id, digest)
    assert (decision.status, decision.steps_committed, decision.effects_dispatched) == (
        TransactionStatus.ABORTED, 0, 0)
    assert committed(agent, account) == 150
    assert not (dep.fs_root / f"receipt-{uniq}.txt").exists()
    h = agent.history(tx.id)
    assert (h.status, h.ended_by) == (TransactionStatus.ABORTED, "alice")
    assert h.reason == f'commit aborted: conflict on kv key "{account}"'
    assert deliveries(dep.hooks, f"pay-{uniq}") == 0
    assert dep.decisions("conflict") == conflicts + 1


def test_the_reaper_rejects_an_approval_that_timed_out(dep, agent, root, uniq):
    expired = dep.decisions("expired")
    tx = agent.begin(agent_id=f"quick-{uniq}")
    assert tx.step("fs.write", {"path": f"q-{uniq}.txt", "contents": "x"}).ok
    payment(tx, f"pay-{uniq}")
    result = tx.commit()
    shown = pending(root, tx.id)
    assert shown.expires_at - shown.requested_at == pytest.approx(QUICK_TIMEOUT_S)
    h = eventually(lambda: agent.history(tx.id).ended and agent.history(tx.id),
                   slack(QUICK_TIMEOUT_S + SWEEP_S), "rejected by the reaper")
    assert (h.status, h.ended_by, h.reason) == (TransactionStatus.REJECTED, "reaper",
                                                "approval timed out")
    assert not (dep.fs_root / f"q-{uniq}.txt").exists()
    assert pending(root, tx.id) is None
    with pytest.raises(NotFound):
        root.approve(tx.id, result.approval_digest)
    assert deliveries(dep.hooks, f"pay-{uniq}") == 0
    assert dep.decisions("expired") >= expired + 1


def test_the_idle_reaper_leaves_a_transaction_awaiting_approval_alone(dep, agent, alice, uniq):
    waiting = agent.begin(agent_id=f"idle-wait-{uniq}")
    payment(waiting, f"pay-{uniq}")
    digest = waiting.commit().approval_digest
    idle = agent.begin(agent_id=f"idle-other-{uniq}")
    assert idle.step("kv.put", {"key": f"idle-{uniq}", "value": 1}).ok
    # the other one, idle under the same policy, is expired: the reaper swept past both
    h = eventually(lambda: agent.history(idle.id).ended and agent.history(idle.id),
                   slack(IDLE_POLICY_S + SWEEP_S), "the idle one expired")
    assert (h.status, h.ended_by) == (TransactionStatus.EXPIRED, "reaper")
    assert agent.get(waiting.id).status is TransactionStatus.AWAITING_APPROVAL
    assert alice.approve(waiting.id, digest).status is TransactionStatus.COMMITTED


def test_the_gauges_show_pending_approvals_and_their_age(dep, agent, root, uniq):
    tx = agent.begin()
    payment(tx, f"pay-{uniq}")
    tx.commit()
    eventually(lambda: dep.gauge("agenttx_approvals_pending") == 1, slack(SWEEP_S),
               "one pending")
    eventually(lambda: dep.gauge("agenttx_approval_oldest_pending_seconds") > 0,
               slack(SWEEP_S), "its age")
    rejected = dep.decisions("rejected")
    root.reject(tx.id, "gauge test")
    assert dep.decisions("rejected") == rejected + 1
    eventually(lambda: dep.gauge("agenttx_approvals_pending") == 0, slack(SWEEP_S), "none")
    assert dep.gauge("agenttx_approval_oldest_pending_seconds") == 0


# ---- a replica killed mid-decision ---------------------------------------------------------

@pytest.mark.parametrize(("failpoint", "applied"), [("approval.after_txn", True),
                                                    ("approval.before_txn", False)])
def test_a_replica_killed_mid_decision_never_delivers_twice(dep, agent, alice, uniq,
                                                            failpoint, applied):
    key = f"crash-{uniq}"
    tx = agent.begin()
    assert tx.step("kv.put", {"key": f"c-{uniq}", "value": 7}).ok
    payment(tx, key)
    digest = tx.commit().approval_digest
    doomed = dep.extra_replica(f"approvals-crash-{uniq}",
                               {"AGENTTX_FAILPOINTS": f"{failpoint}=crash"})
    try:
        with doomed.client(token="bob-t0ken") as bob:
            with pytest.raises(Unavailable):
                bob.approve(tx.id, digest)
        eventually(lambda: doomed.process is not None and doomed.process.poll() is not None,
                   slack(1), "the replica died at the failpoint")
    finally:
        doomed.stop()
    if applied:
        # the decision's etcd transaction applied: the others deliver what it committed
        eventually(lambda: deliveries(dep.hooks, key) == 1, slack(CLAIM_S + POLL_S),
                   "delivered by another replica")
        h = agent.history(tx.id)
        assert (h.status, h.ended_by) == (TransactionStatus.COMMITTED, "bob")
        with pytest.raises(NotFound):
            alice.approve(tx.id, digest)   # retrying is safe: it was decided
    else:
        assert agent.get(tx.id).status is TransactionStatus.AWAITING_APPROVAL
        assert deliveries(dep.hooks, key) == 0
        assert alice.approve(tx.id, digest).status is TransactionStatus.COMMITTED
        assert deliveries(dep.hooks, key) == 1
    assert committed(agent, f"c-{uniq}") == 7
    dep.after_more_sweeps()
    assert deliveries(dep.hooks, key) == 1


# ---- the asyncio client ----------------------------------------------------------------------

async def test_the_asyncio_client_waits_lists_and_decides(dep, uniq):
    async with dep.async_client("agent") as agent, dep.async_client("alice", 1) as alice:
        tx = await agent.begin()
        await tx.step("effect.stage", {"channel": "payments", "payload": {"n": 1},
                                       "idempotency_key": f"pay-{uniq}"})
        waited = asyncio.ensure_future(tx.commit(wait_for_approval=slack(10)))

        async def listed() -> Any:
            return [a async for a in alice.approvals() if a.transaction_id == tx.id]

        (shown,) = await eventually_async(listed, slack(2), "listed")
        decision = await alice.approve(tx.id, shown.digest)
        assert decision.status is TransactionStatus.COMMITTED
        result = await waited
        assert (result.committed, result.status, result.steps_committed) == (
            True, TransactionStatus.COMMITTED, 1)
        assert result.history is not None and result.history.ended_by == "alice"
    assert deliveries(dep.hooks, f"pay-{uniq}") == 1


def test_waiting_for_a_decision_that_does_not_come_returns_still_awaiting(dep, agent, uniq):
    tx = agent.begin()
    payment(tx, f"pay-{uniq}")
    started = time.monotonic()
    result = tx.commit(wait_for_approval=0.5)
    assert time.monotonic() - started >= 0.5
    assert (result.committed, result.awaiting_approval, result.status) == (
        False, True, TransactionStatus.AWAITING_APPROVAL)
    with pytest.raises(InvalidArgument, match="wait_for_approval must be"):
        agent.begin().commit(wait_for_approval=-1)


# ---- the CLI ---------------------------------------------------------------------------------

def approvals_cli(dep: Deployment, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agenttx", "approvals", *args,
                           "--target", dep.replicas[0].target],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AGENTTX_TOKEN": f"{who}-t0ken"})


def test_the_cli_approves_and_rejects(dep, agent, uniq):
    first = agent.begin(agent_id="refund-bot")
    assert first.step("kv.put", {"key": f"cli-{uniq}", "value": 1}).ok
    payment(first, f"pay-{uniq}")
    digest = first.commit().approval_digest
    second = agent.begin(agent_id="refund-bot")
    payment(second, f"pay2-{uniq}", 7)
    second.commit()

    listed = approvals_cli(dep, "alice", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["transaction_id"]: r for r in json.loads(listed.stdout)}
    assert rows[first.id] == {
        "transaction_id": first.id, "principal": "billing-agent", "agent_id": "refund-bot",
        "digest": digest, "gated": [{"step_id": 2, "tool": "effect.stage",
                                     "channel": "payments",
                                     "arguments": {"amount": 10, "order": f"pay-{uniq}"}}],
        "write_keys": [f"kv:cli-{uniq}"], "requested_at": rows[first.id]["requested_at"],
        "expires_at": rows[first.id]["expires_at"]}
    text = approvals_cli(dep, "alice", "list")
    assert text.returncode == 0
    block = next(b for b in text.stdout.split("\n\n") if first.id in b).splitlines()
    assert block[0] == f"transaction  {first.id}"
    assert block[1:3] == ["principal    billing-agent", "agent        refund-bot"]
    assert block[5] == f"digest       {digest}"
    assert block[6:8] == ["gated steps", "  step 2    effect.stage -> payments  "
                          f'{{"amount":10,"order":"pay-{uniq}"}}']
    assert block[8] == f"writes       kv:cli-{uniq}"
    assert block[9] == f"decide       agenttx approvals approve {first.id} --digest {digest}"

    wrong = approvals_cli(dep, "alice", "approve", first.id, "--digest", "f" * 64)
    assert (wrong.returncode, wrong.stdout) == (5, "")
    assert wrong.stderr.startswith("agenttx approvals approve: the digest does not match")
    own = approvals_cli(dep, "carol", "approve", first.id, "--digest", digest)
    assert (own.returncode, own.stderr) == (4, "agenttx approvals approve: PERMISSION_DENIED: "
                                               "DecideApproval needs the approver or admin "
                                               "role\n")
    usage = approvals_cli(dep, "alice", "reject", first.id)
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1
    assert "--reason" in usage.stderr

    approved = approvals_cli(dep, "alice", "approve", first.id, "--digest", digest)
    assert (approved.returncode, approved.stdout, approved.stderr) == (
        0, f"approved transaction {first.id}: committed 2 steps, 1 effect delivered\n", "")
    rejected = approvals_cli(dep, "bob", "reject", second.id, "--reason", "duplicate refund")
    assert (rejected.returncode, rejected.stdout, rejected.stderr) == (
        0, f"rejected transaction {second.id}: everything it did was undone\n", "")
    gone = approvals_cli(dep, "bob", "reject", second.id, "--reason", "again")
    assert gone.returncode == 3 and gone.stderr.startswith(
        f"agenttx approvals reject: transaction {second.id} not found")
    assert deliveries(dep.hooks, f"pay-{uniq}") == 1
    assert deliveries(dep.hooks, f"pay2-{uniq}") == 0
    assert agent.history(second.id).reason == "duplicate refund"


# ---- MCP -------------------------------------------------------------------------------------

async def test_mcp_commit_says_it_awaits_approval_with_the_digest(dep, uniq):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "agenttx", "mcp", "--target", dep.replicas[0].target, "--agent-id",
              "mcp-refunds"],
        env={**os.environ, "AGENTTX_TOKEN": "agent-t0ken"})
    async with McpClient(params, mode="legacy") as mcp:
        staged = await mcp.call_tool("effect_stage", {
            "channel": "payments", "payload": {"amount": 5}, "idempotency_key": f"pay-{uniq}"})
        assert not staged.is_error
        tx = staged.structured_content["transaction"]
        done = await mcp.call_tool("agenttx_commit", {})
    assert not done.is_error
    digest = done.structured_content["approval_digest"]
    assert done.structured_content == {"transaction": tx, "committed": False,
                                       "awaiting_approval": True, "approval_digest": digest}
    assert done.content[0].text == (f"Transaction {tx} was not committed yet: it awaits a "
                                    f"person's approval (digest {digest}).")
    with dep.client("alice") as alice:
        # closing the MCP session did not withdraw it: it is a person's to decide now
        assert pending(alice, tx).digest == digest
        assert alice.approve(tx, digest).status is TransactionStatus.COMMITTED
    assert deliveries(dep.hooks, f"pay-{uniq}") == 1



# ---- without authentication ------------------------------------------------------------

def test_without_authentication_anyone_decides_even_its_own(etcd, scratch, uniq):
    """No identities (loopback, --auth none): the one anonymous caller is admin and
    approver, so four eyes cannot be enforced (docs/approvals.md says so)."""
    env = {"AGENTTX_DEFAULT_POLICY__APPROVAL": json.dumps(
        {"required": [{"tool": "kv.delete"}]})}
    with ServiceProcess(f"approvals-anon-{uniq}", etcd_endpoints=etcd.endpoints,
                        prefix=f"/agenttx-approvals-anon-{uniq}",
                        workdir=pathlib.Path(scratch) / "approvals-anon", env=env) as svc, \
            svc.client() as anyone:
        tx = anyone.begin()
        assert tx.step("kv.put", {"key": "a", "value": 1}).ok
        assert tx.step("kv.delete", {"key": "b"}).ok
        digest = tx.commit().approval_digest
        (shown,) = [a for a in anyone.approvals() if a.transaction_id == tx.id]
        assert (shown.principal, shown.gated) == ("", (GatedStep(2, "kv.delete", "",
                                                                 '{"key":"b"}'),))
        assert shown.write_keys == ("kv:a", "kv:b")
        assert anyone.approve(tx.id, digest).status is TransactionStatus.COMMITTED
        assert (anyone.history(tx.id).status, anyone.history(tx.id).ended_by) == (
            TransactionStatus.COMMITTED, "")
