"""What an operator's Prometheus sees (SPEC §10, §10.1 "Metrics"), scraped from real replicas.

Two real `agenttx serve` replicas share one real etcd, each serving `/metrics` on its own
`--metrics-listen` port; the tests scrape that endpoint over HTTP and parse it with
prometheus-client's own text parser, before and after driving RPCs at replica A, and
assert the exact increments a dashboard would show: RPCs per rpc and gRPC code, steps per
tool and status, rollbacks and rollback latency observations per strategy, transactions
ended per outcome, deliveries per channel and result, the leader-reported gauges. Replica B
never receives an RPC, so it is the "fresh replica" of the zero-initialisation test.

Effects go to the always-on `log` channel and to `hooks`, a webhook whose real loopback
receiver the backlog test turns off and on again.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client.parser import text_string_to_metric_families

from agenttx import version as agenttx
from agenttx.embedded_etcd import free_port
from agenttx.observability import metrics as m
from agenttx.tools.registry import ToolRegistry
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from support.rpc import expect_error
from support.service import Agent, ServiceProcess

Key = tuple[str, tuple[tuple[str, str], ...]]
Samples = dict[Key, float]

CHANNELS = ("hooks", "log")
# Families whose every change comes from the RPCs a test sends (no background job moves
# them while no effect waits in the outbox and no transaction is idle past its timeout).
RPC_DRIVEN = ("agenttx_rpc_duration_seconds_count", "agenttx_steps_total",
              "agenttx_rollbacks_total", "agenttx_rollback_duration_seconds_count",
              "agenttx_transactions_ended_total", "agenttx_cas_conflicts_total",
              "agenttx_effect_deliveries_total", "agenttx_effect_delivery_attempts_total")


@dataclass
class Replica:
    process: ServiceProcess
    metrics_url: str

    @property
    def stub(self) -> pb_grpc.AgentTxServiceStub:
        return self.process.stub

    def text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            return str(resp.read().decode())

    def scrape(self) -> Samples:
        """Every sample of one scrape: (sample name, sorted labels) -> value."""
        out: Samples = {}
        for family in text_string_to_metric_families(self.text()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


def key(name: str, **labels: str) -> Key:
    return name, tuple(sorted(labels.items()))


def changes(before: Samples, after: Samples, families: tuple[str, ...] = RPC_DRIVEN
            ) -> dict[Key, float]:
    """The samples of `families` that moved between two scrapes, by how much."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()
            if k[0] in families and v != before.get(k, 0.0)}


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pair(etcd, scratch, hooks) -> Iterator[tuple[Replica, Replica]]:
    prefix = f"/agenttx-metrics-{uuid.uuid4().hex[:6]}"
    sandbox = scratch / f"metrics-sandbox-{prefix[-6:]}"
    sandbox.mkdir(parents=True)
    channels = {"hooks": {"kind": "webhook", "url": hooks.url, "timeout_s": 2}}
    replicas: list[Replica] = []
    try:
        for name in ("metrics-a", "metrics-b"):
            port = free_port()
            proc = ServiceProcess(
                f"{name}-{prefix[-6:]}", etcd_endpoints=etcd.endpoints, prefix=prefix,
                fs_root=str(sandbox), workdir=scratch / "metrics",
                env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)},
                # idle transactions are reaped after 120 s: never during these tests, so
                # the reaper moves no counter; it still reports the gauges every 5 s.
                extra_args=["--metrics-listen", f"127.0.0.1:{port}", "--effect-poll-s", "0.2",
                            "--effect-claim-s", "1", "--tx-idle-timeout-s", "120"])
            replicas.append(Replica(proc.start(), f"http://127.0.0.1:{port}/metrics"))
        yield replicas[0], replicas[1]
    finally:
        for r in replicas:
            r.process.stop()


@pytest.fixture(scope="module")
def sandbox(pair):
    return pair[0].process.fs_root


# ---- a fresh replica --------------------------------------------------------------------

def test_a_fresh_replica_exports_every_dashboard_series_at_zero(pair):
    fresh = pair[1].scrape()  # replica B never receives an RPC in this module
    tools = ToolRegistry.load().names()
    zero = [key("agenttx_rpc_duration_seconds_count", rpc=rpc, code="OK") for rpc in m.RPCS]
    zero += [key("agenttx_steps_total", tool=tool, status=status)
             for tool in [*tools, "unknown"] for status in m.STEP_STATUSES]
    zero += [key("agenttx_rollbacks_total", strategy=s) for s in m.STRATEGIES]
    zero += [key("agenttx_transactions_ended_total", outcome=o) for o in m.TX_OUTCOMES]
    zero += [key("agenttx_cas_conflicts_total", operation=op)
             for op in ("step", "commit", "rollback")]
    zero += [key("agenttx_rpc_duration_seconds_bucket", rpc=rpc, code="OK", le="+Inf")
             for rpc in m.RPCS]
    assert {k: fresh.get(k) for k in zero} == dict.fromkeys(zero, 0.0)
    # present (their values move with background work: leases, reaper, dispatcher)
    present = [key("agenttx_etcd_requests_total", operation=op) for op in m.ETCD_OPERATIONS]
    present += [key("agenttx_effect_delivery_attempts_total", channel=c) for c in CHANNELS]
    present += [key("agenttx_effect_deliveries_total", channel=c, result=r)
                for c in CHANNELS for r in m.DELIVERY_RESULTS]
    present += [key("agenttx_leader", role=role) for role in m.ROLES]
    present += [key(g) for g in ("agenttx_open_transactions",
                                 "agenttx_transactions_awaiting_rollback",
                                 "agenttx_outbox_depth", "agenttx_outbox_oldest_age_seconds",
                                 "agenttx_effects_dead_letters")]
    assert [k for k in present if k not in fresh] == []
    assert "strategy=\"none\"" not in pair[1].text()  # ROLLBACK_STRATEGY_NONE is no rollback
    build = [(k, v) for k, v in fresh.items() if k[0] == "agenttx_build_info"]
    assert len(build) == 1 and build[0][1] == 1.0
    assert dict(build[0][0][1])["version"] == agenttx.__version__


# ---- a scripted workload: the exact increments -------------------------------------------

def test_a_scripted_workload_moves_each_counter_by_exactly_what_happened(pair):
    a = pair[0]
    u = uuid.uuid4().hex[:8]
    before = a.scrape()

    # 1: success, a failing read (LOCAL_BACKTRACK), the retry, a log effect, commit
    t1 = Agent(a.stub, agent_id=f"m1-{u}")
    t1.ok("kv.put", {"key": f"k1-{u}", "value": 1})
    failed = t1.step("kv.get", {"key": f"missing-{u}"})
    assert (failed.status, failed.strategy, failed.error_category) == (
        pb.STEP_STATUS_ROLLBACK_TRIGGERED, pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK, "no_data_found")
    t1.ok("kv.put", {"key": f"k2-{u}", "value": 2})
    t1.ok("effect.stage", {"channel": "log", "payload": {"order": u}})
    assert t1.get().next_step_id == 4
    done = t1.commit()
    assert (done.committed, done.steps_committed, done.effects_dispatched) == (True, 3, 1)

    # 2: no retries, no resets: an unknown tool ABORTs; then the transaction is gone
    t2 = Agent(a.stub, agent_id=f"m2-{u}", max_local_depth=0, max_global_resets=0)
    t2.ok("kv.put", {"key": f"k3-{u}", "value": 3})
    aborted = t2.step("kv.gett", {"key": f"k3-{u}"})
    assert (aborted.status, aborted.strategy) == (pb.STEP_STATUS_FAILED, pb.ROLLBACK_STRATEGY_ABORT)
    expect_error(a.stub.GetTransaction, pb.GetTransactionRequest(transaction_id=t2.tx),
                 grpc.StatusCode.NOT_FOUND)

    # 3: the client aborts (RollbackTransaction without to_step)
    t3 = Agent(a.stub, agent_id=f"m3-{u}")
    t3.ok("kv.put", {"key": f"k4-{u}", "value": 4})
    assert t3.rollback().rolled_back

    # 4 and 5 write one key; 5 commits first, so 4's commit loses its compare-and-swap
    t4, t5 = Agent(a.stub, agent_id=f"m4-{u}"), Agent(a.stub, agent_id=f"m5-{u}")
    t4.ok("kv.put", {"key": f"c-{u}", "value": 4})
    t5.ok("kv.put", {"key": f"c-{u}", "value": 5})
    assert t5.commit().committed
    expect_error(a.stub.CommitTransaction, pb.CommitTransactionRequest(transaction_id=t4.tx),
                 grpc.StatusCode.ABORTED, "conflict")
    a.stub.ListTransactions(pb.ListTransactionsRequest())

    after = a.scrape()
    rpc = "agenttx_rpc_duration_seconds_count"
    assert changes(before, after) == {
        key(rpc, rpc="BeginTransaction", code="OK"): 5,
        key(rpc, rpc="ExecuteStep", code="OK"): 9,  # a failed step is an OK RPC
        key(rpc, rpc="GetTransaction", code="OK"): 1,
        key(rpc, rpc="GetTransaction", code="NOT_FOUND"): 1,
        key(rpc, rpc="CommitTransaction", code="OK"): 2,
        key(rpc, rpc="CommitTransaction", code="ABORTED"): 1,
        key(rpc, rpc="RollbackTransaction", code="OK"): 1,
        key(rpc, rpc="ListTransactions", code="OK"): 1,
        key("agenttx_steps_total", tool="kv.put", status="success"): 6,
        key("agenttx_steps_total", tool="effect.stage", status="success"): 1,
        key("agenttx_steps_total", tool="kv.get", status="rollback_triggered"): 1,
        key("agenttx_steps_total", tool="unknown", status="failed"): 1,
        key("agenttx_rollbacks_total", strategy="local_backtrack"): 1,
        key("agenttx_rollbacks_total", strategy="abort"): 2,  # the step's and the client's
        key("agenttx_rollback_duration_seconds_count", strategy="local_backtrack"): 1,
        key("agenttx_rollback_duration_seconds_count", strategy="abort"): 2,
        key("agenttx_transactions_ended_total", outcome="committed"): 2,
        key("agenttx_transactions_ended_total", outcome="failed"): 1,
        key("agenttx_transactions_ended_total", outcome="aborted"): 1,
        key("agenttx_transactions_ended_total", outcome="conflict"): 1,
        key("agenttx_cas_conflicts_total", operation="commit"): 1,
        key("agenttx_effect_delivery_attempts_total", channel="log"): 1,
        key("agenttx_effect_deliveries_total", channel="log", result="delivered"): 1,
    }
    # every histogram's +Inf bucket is its count; the sum of a latency is positive
    for (name, labels), value in after.items():
        if name.endswith("_count") and name.startswith("agenttx_"):
            base = name[:-len("_count")]
            assert after[(f"{base}_bucket", tuple(sorted((*labels, ("le", "+Inf")))))] == value
    moved = changes(before, after, ("agenttx_rpc_duration_seconds_sum",))
    assert len(moved) == 8 and all(v > 0 for v in moved.values())

    # etcd: every operation these RPCs perform is counted under its own label, and no
    # fewer round trips than the access log reports (background work may add more)
    etcd = changes(before, after, ("agenttx_etcd_requests_total",))
    for op in ("begin", "step", "commit", "rollback", "get", "list"):
        assert etcd.get(key("agenttx_etcd_requests_total", operation=op), 0) > 0, op
    assert etcd[key("agenttx_etcd_requests_total", operation="begin")] == 5  # 1 per begin
    logged = sum(r["etcd_round_trips"] for r in a.process.logs()
                 if r.get("msg") == "rpc" and r.get("agent_id", "").endswith(u))
    assert logged > 0 and sum(etcd.values()) >= logged
    latency = changes(before, after, ("agenttx_etcd_request_duration_seconds_count",))
    for op in ("begin", "step", "commit", "rollback", "get", "list"):
        assert latency.get(key("agenttx_etcd_request_duration_seconds_count", operation=op),
                           0) > 0, op


def test_health_and_reflection_calls_are_not_counted(pair):
    a = pair[0]
    before = a.scrape()
    health = health_pb2_grpc.HealthStub(a.process.channel)
    for service in ("", "agenttx.v1.AgentTxService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status \
            == health_pb2.HealthCheckResponse.SERVING
    expect_error(health.Check, health_pb2.HealthCheckRequest(service="no.such.Service"),
                 grpc.StatusCode.NOT_FOUND)
    services = ProtoReflectionDescriptorDatabase(a.process.channel).get_services()
    assert "agenttx.v1.AgentTxService" in services
    after = a.scrape()
    assert changes(before, after, ("agenttx_rpc_duration_seconds_count",
                                   "agenttx_rpc_duration_seconds_sum")) == {}
    assert {dict(labels)["rpc"] for name, labels in after
            if name.startswith("agenttx_rpc_duration_seconds")} == set(m.RPCS)


def test_label_values_are_bounded_never_an_id(pair):
    a = pair[0]
    u = uuid.uuid4().hex
    agent = Agent(a.stub, agent_id=f"agent-{u}", metadata={"team": f"team-{u}"})
    bogus = f"tool-{u}"
    assert agent.step(bogus, {"key": u}).status == pb.STEP_STATUS_ROLLBACK_TRIGGERED
    agent.ok("effect.stage", {"channel": "log", "idempotency_key": f"idem-{u}"})
    assert agent.commit().committed
    expect_error(a.stub.GetTransaction, pb.GetTransactionRequest(transaction_id=agent.tx),
                 grpc.StatusCode.NOT_FOUND)
    text = a.text()
    # the transaction id, agent id, metadata, tool name and idempotency key share `u`
    assert u not in text and agent.tx not in text

    codes = {c.name for c in grpc.StatusCode}
    allowed: dict[str, set[str]] = {
        "rpc": set(m.RPCS), "code": codes, "status": set(m.STEP_STATUSES),
        "tool": {*ToolRegistry.load().names(), "unknown"}, "strategy": set(m.STRATEGIES),
        "operation": set(m.ETCD_OPERATIONS), "outcome": set(m.TX_OUTCOMES),
        "decision": set(m.APPROVAL_DECISIONS),
        "role": set(m.ROLES), "channel": {*CHANNELS, "unknown"},
        "result": set(m.DELIVERY_RESULTS), "version": {agenttx.__version__},
    }
    buckets = {str(float(b)) for b in m._LATENCY_BUCKETS} | {"+Inf"}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("agenttx_"), family.name
        for s in family.samples:
            for label, value in s.labels.items():
                if label == "le":
                    assert value in buckets, (s.name, value)
                elif label == "python":
                    assert re.fullmatch(r"\d+\.\d+\.\d+", value), value
                else:
                    assert value in allowed[label], (s.name, label, value)


# ---- leader-reported gauges ----------------------------------------------------------------

def gauges(pair, name: str) -> list[float]:
    return sorted(r.scrape()[key(name)] for r in pair)


def test_each_role_has_exactly_one_leader_across_the_replicas(pair):
    def leaders(role: str) -> list[float]:
        return sorted(r.scrape()[key("agenttx_leader", role=role)] for r in pair)

    for role in m.ROLES:
        wait_for(f"one {role} leader", lambda role=role: leaders(role) == [0.0, 1.0])


def test_the_reaper_leader_reports_open_and_awaiting_transactions(pair, sandbox):
    a = pair[0]
    u = uuid.uuid4().hex[:8]
    open_ = [Agent(a.stub, agent_id=f"open-{u}-{i}") for i in range(3)]
    for t in open_:
        t.ok("kv.put", {"key": f"o-{u}-{t.tx[:4]}", "value": 1})
    # the leader counts them, the other replica reports 0 (dashboards take the max)
    wait_for("3 open", lambda: gauges(pair, "agenttx_open_transactions") == [0.0, 3.0])
    assert gauges(pair, "agenttx_transactions_awaiting_rollback") == [0.0, 0.0]

    # an undo that cannot run (a directory now stands where the step created a file)
    stuck = open_[0]
    stuck.ok("fs.write", {"path": f"stuck-{u}.txt", "contents": "created by step 2"})
    blocker = sandbox / f"stuck-{u}.txt"
    blocker.unlink()
    blocker.mkdir()
    (blocker / "inside.txt").write_text("in the way")
    before = a.scrape()
    resp = stuck.rollback(to_step=2)
    assert resp.rolled_back is False and len(resp.compensation_errors) == 1
    assert changes(before, a.scrape()) == {
        key("agenttx_rpc_duration_seconds_count", rpc="RollbackTransaction", code="OK"): 1,
        key("agenttx_rollbacks_total", strategy="manual"): 1,
        key("agenttx_rollback_duration_seconds_count", strategy="manual"): 1,
    }
    wait_for("1 awaiting", lambda: gauges(pair, "agenttx_transactions_awaiting_rollback")
             == [0.0, 1.0])
    assert gauges(pair, "agenttx_open_transactions") == [0.0, 3.0]  # awaiting is still open

    # resolved (the runbook): remove the obstacle, roll back again; abort the rest
    (blocker / "inside.txt").unlink()
    blocker.rmdir()
    for t in open_:
        assert t.rollback().rolled_back
    wait_for("none open", lambda: gauges(pair, "agenttx_open_transactions") == [0.0, 0.0])
    assert gauges(pair, "agenttx_transactions_awaiting_rollback") == [0.0, 0.0]


# ---- the outbox ----------------------------------------------------------------------------

def summed(pair, name: str, **labels: str) -> float:
    return sum(r.scrape().get(key(name, **labels), 0.0) for r in pair)


def test_an_undeliverable_effect_shows_as_backlog_until_its_receiver_recovers(pair, hooks):
    a = pair[0]
    u = uuid.uuid4().hex[:8]
    attempts = "agenttx_effect_delivery_attempts_total"
    results = "agenttx_effect_deliveries_total"
    failed0 = summed(pair, results, channel="hooks", result="failed")
    delivered0 = summed(pair, results, channel="hooks", result="delivered")
    attempts0 = summed(pair, attempts, channel="hooks")
    hooks.status = 503
    try:
        agent = Agent(a.stub, agent_id=f"backlog-{u}")
        agent.ok("effect.stage", {"channel": "hooks", "payload": {"n": 1},
                                  "idempotency_key": f"backlog-{u}"})
        done = agent.commit()
        assert (done.committed, done.effects_dispatched, len(done.dispatch_errors)) == (True, 0, 1)
        # the dispatcher leader retries in the background and reports the backlog
        wait_for("a background retry", lambda: summed(
            pair, results, channel="hooks", result="failed") >= failed0 + 2)
        wait_for("depth 1", lambda: gauges(pair, "agenttx_outbox_depth") == [0.0, 1.0])
        wait_for("an aging backlog",
                 lambda: max(gauges(pair, "agenttx_outbox_oldest_age_seconds")) > 0.5)
    finally:
        hooks.status = 200
    wait_for("delivery", lambda: summed(pair, results, channel="hooks", result="delivered")
             == delivered0 + 1, timeout=90)
    wait_for("an empty outbox", lambda: gauges(pair, "agenttx_outbox_depth") == [0.0, 0.0])
    assert gauges(pair, "agenttx_outbox_oldest_age_seconds") == [0.0, 0.0]
    failed = summed(pair, results, channel="hooks", result="failed") - failed0
    # one attempt per result; exactly one confirmed delivery for the key
    assert summed(pair, attempts, channel="hooks") - attempts0 == failed + 1
    assert failed >= 2 and hooks.keys()[f"backlog-{u}"] == failed + 1
