"""Prometheus metrics of one replica (SPEC §10), in a registry of their own.

Why one module: the chart's dashboard and alerts, docs/operations.md and the tests all
refer to these names; `EXPORTED` is the list they are checked against, so a renamed
metric cannot silently leave a dashboard panel empty.

Label values are bounded by construction: `rpc` is a method name, `code` a gRPC code
name, `tool` a registered tool name (anything else is `unknown`), `strategy`, `status`,
`operation`, `channel` and `role` come from closed sets. Never a transaction or agent id.
Gauges computed by a leader (open transactions, approvals pending, outbox depth, dead
letters) are 0 on other replicas, so dashboards aggregate them with `max`.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..version import __version__

RPCS = ("BeginTransaction", "ExecuteStep", "CommitTransaction", "RollbackTransaction",
        "GetTransaction", "ListTransactions", "ListApprovals", "DecideApproval")
STEP_STATUSES = ("success", "rollback_triggered", "failed")
STRATEGIES = ("local_backtrack", "dependency_jump", "global_reset", "manual", "abort")
# etcd round trips, by what the replica was doing (store.client `what=` names map here).
ETCD_OPERATIONS = ("begin", "step", "load", "commit", "rollback", "get", "list", "touch",
                   "reaper", "outbox", "lease", "policy", "auth", "other")
TX_OUTCOMES = ("committed", "conflict", "aborted", "failed", "expired", "rejected")
# How a pending approval ended (docs/approvals.md): an approver approved (and it
# committed) or rejected it, it timed out (the reaper), its owner rolled it back, or it
# was approved but a key it read or wrote had been committed by another transaction.
APPROVAL_DECISIONS = ("approved", "rejected", "expired", "withdrawn", "conflict")
ROLES = ("dispatcher", "reaper")
# delivered: the receiver confirmed; failed: a transient failure, retried with backoff;
# refused: a permanent refusal, moved to the dead letters (effects.delivery).
DELIVERY_RESULTS = ("delivered", "failed", "refused")

# Latency buckets for a service whose floor is ~1-2 ms (one gRPC hop + one etcd write).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Every metric of a replica. One instance per process (`METRICS`); tests read it."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.build_info = Gauge("agenttx_build_info", "Build of this replica (always 1).",
                                ["version", "python"], registry=r)
        self.rpc_duration = Histogram(
            "agenttx_rpc_duration_seconds", "Time to answer an AgentTx RPC, by method and "
            "gRPC status code (health and reflection excluded).", ["rpc", "code"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.steps = Counter("agenttx_steps_total", "Steps executed, by tool and status.",
                             ["tool", "status"], registry=r)
        self.rollbacks = Counter(
            "agenttx_rollbacks_total", "Rollbacks after a failed step or requested by a "
            "client, by strategy (every failed step counts once).", ["strategy"], registry=r)
        self.rollback_duration = Histogram(
            "agenttx_rollback_duration_seconds", "Time spent undoing and restoring, by "
            "strategy.", ["strategy"], buckets=_LATENCY_BUCKETS, registry=r)
        self.etcd_requests = Counter(
            "agenttx_etcd_requests_total", "etcd round trips, by operation.", ["operation"],
            registry=r)
        self.etcd_duration = Histogram(
            "agenttx_etcd_request_duration_seconds", "Latency of one etcd round trip, by "
            "operation.", ["operation"], buckets=_LATENCY_BUCKETS, registry=r)
        self.cas_conflicts = Counter(
            "agenttx_cas_conflicts_total", "Compare-and-swap writes that lost their compare "
            "(a stale replica cache, a race between replicas, a commit conflict).",
            ["operation"], registry=r)
        self.transactions_ended = Counter(
            "agenttx_transactions_ended_total", "Transactions ended, by outcome.",
            ["outcome"], registry=r)
        self.open_transactions = Gauge(
            "agenttx_open_transactions", "Open transactions in the deployment (reported by "
            "the reaper leader; 0 elsewhere).", registry=r)
        self.awaiting_rollback = Gauge(
            "agenttx_transactions_awaiting_rollback", "Transactions waiting for a manual "
            "RollbackTransaction (reported by the reaper leader; 0 elsewhere).", registry=r)
        self.approvals_pending = Gauge(
            "agenttx_approvals_pending", "Transactions awaiting a person's approval "
            "(reported by the reaper leader; 0 elsewhere).", registry=r)
        self.approval_oldest_age = Gauge(
            "agenttx_approval_oldest_pending_seconds", "How long the oldest pending "
            "approval has waited (reaper leader; 0 elsewhere, and when none is pending).",
            registry=r)
        self.approval_decisions = Counter(
            "agenttx_approval_decisions_total", "Pending approvals ended, by how: approved, "
            "rejected, expired, withdrawn (rolled back by their owner), conflict (approved, "
            "but aborted by a conflicting commit).", ["decision"], registry=r)
        self.outbox_depth = Gauge(
            "agenttx_outbox_depth", "Committed effects not yet confirmed delivered (reported "
            "by the dispatcher leader; 0 elsewhere).", registry=r)
        self.outbox_oldest_age = Gauge(
            "agenttx_outbox_oldest_age_seconds", "Age of the oldest undelivered effect "
            "(dispatcher leader; 0 elsewhere).", registry=r)
        self.dead_letters = Gauge(
            "agenttx_effects_dead_letters", "Deliveries refused permanently and kept as dead "
            "letters until an admin retries or discards them (dispatcher leader; 0 "
            "elsewhere).", registry=r)
        self.delivery_attempts = Counter(
            "agenttx_effect_delivery_attempts_total", "Effect delivery attempts, by channel.",
            ["channel"], registry=r)
        self.deliveries = Counter(
            "agenttx_effect_deliveries_total", "Effect delivery results, by channel and "
            "result.", ["channel", "result"], registry=r)
        self.leader = Gauge("agenttx_leader", "1 while this replica holds the role's lease.",
                            ["role"], registry=r)
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, memoised: labels() takes a lock and builds a key on
        every call, and the hot path updates a few series per RPC."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def zero_initialise(self, tools: Iterable[str], channels: Iterable[str]) -> None:
        """Create the labelled series dashboards and alerts use, at 0, so a rate() over a
        quiet replica is 0 rather than absent."""
        for rpc in RPCS:
            self.rpc_duration.labels(rpc, "OK")
        for tool in [*tools, "unknown"]:
            for status in STEP_STATUSES:
                self.steps.labels(tool, status)
        for strategy in STRATEGIES:
            self.rollbacks.labels(strategy)
        for op in ETCD_OPERATIONS:
            self.etcd_requests.labels(op)
        for op in ("step", "commit", "rollback"):
            self.cas_conflicts.labels(op)
        for outcome in TX_OUTCOMES:
            self.transactions_ended.labels(outcome)
        for decision in APPROVAL_DECISIONS:
            self.approval_decisions.labels(decision)
        for channel in channels:
            self.delivery_attempts.labels(channel)
            for result in DELIVERY_RESULTS:
                self.deliveries.labels(channel, result)
        for role in ROLES:
            self.leader.labels(role).set(0)


METRICS = Metrics()

# Every metric name a scrape shows (histograms add _bucket/_sum/_count, counters _total).
EXPORTED = frozenset({
    "agenttx_build_info", "agenttx_rpc_duration_seconds", "agenttx_steps_total",
    "agenttx_rollbacks_total", "agenttx_rollback_duration_seconds",
    "agenttx_etcd_requests_total", "agenttx_etcd_request_duration_seconds",
    "agenttx_cas_conflicts_total", "agenttx_transactions_ended_total",
    "agenttx_open_transactions", "agenttx_transactions_awaiting_rollback",
    "agenttx_approvals_pending", "agenttx_approval_oldest_pending_seconds",
    "agenttx_approval_decisions_total",
    "agenttx_outbox_depth", "agenttx_outbox_oldest_age_seconds",
    "agenttx_effects_dead_letters", "agenttx_effect_delivery_attempts_total",
    "agenttx_effect_deliveries_total",
    "agenttx_leader",
})
