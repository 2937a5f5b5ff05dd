"""The etcd round-trip budget per RPC (docs/architecture.md), read from the access log:
ONE round trip per successful step on the replica that served the transaction's previous
call, whatever the step's tool; one more when another replica serves it. The history
(one entry per step sent, the end record) is folded into those same transactions: it
adds no round trip anywhere, and reading it back is one."""

from __future__ import annotations

from agenttx.v1 import agenttx_pb2 as pb
from support.service import Agent
from support.waiting import eventually, slack


def _trips(replica, n: int) -> list[tuple[str, int]]:
    """(rpc, etcd round trips) of the replica's last `n` RPCs. Each `rpc` line is logged
    before its answer is sent: only reading the log file back can lag."""
    def last() -> list[tuple[str, int]] | None:
        rows = [(e["rpc"], e["etcd_round_trips"]) for e in replica.logs()
                if e.get("msg") == "rpc"]
        return rows[-n:] if len(rows) >= n else None
    return eventually(last, slack(0.1), f"{n} rpc log lines")


def test_each_successful_rpc_stays_within_its_etcd_round_trip_budget(replicas, uniq):
    replica = replicas[0]
    agent = Agent(replica.stub)
    agent.ok("kv.put", {"key": f"rt-{uniq}", "value": 1})
    agent.ok("kv.get", {"key": f"rt-{uniq}"})
    agent.ok("kv.delete", {"key": f"rt-other-{uniq}"})
    agent.ok("record.insert", {"table": f"rt{uniq}", "id": 1})
    agent.ok("record.insert", {"table": f"rt{uniq}x", "id": 2, "fields": {"p": 1},
                               "references": {"p": f"rt{uniq}"}})
    agent.ok("record.get", {"table": f"rt{uniq}", "id": 1})
    agent.ok("fs.write", {"path": f"rt-{uniq}.txt", "contents": "x"})
    agent.ok("fs.write", {"path": f"rt-{uniq}.txt", "contents": "y"})
    agent.ok("fs.read", {"path": f"rt-{uniq}.txt"})
    agent.ok("effect.stage", {"channel": "log", "payload": 1})
    assert agent.commit().committed
    rows = _trips(replica, 12)
    assert rows[0] == ("BeginTransaction", 1)
    assert [r for r in rows[1:11]] == [("ExecuteStep", 1)] * 10
    # commit: one CAS, and one write retiring the one delivered effect
    assert rows[11] == ("CommitTransaction", 2)


def test_a_commit_without_effects_is_one_round_trip(replicas, uniq):
    replica = replicas[1]
    agent = Agent(replica.stub)
    agent.ok("kv.put", {"key": f"rt2-{uniq}", "value": 1})
    assert agent.commit().committed
    assert _trips(replica, 1) == [("CommitTransaction", 1)]


def test_a_step_on_another_replica_reads_once_then_writes(replicas, uniq):
    a, b = replicas
    agent = Agent(a.stub)
    agent.ok("kv.put", {"key": f"rt3-{uniq}", "value": 1})
    agent.ok("kv.put", {"key": f"rt3b-{uniq}", "value": 2}, stub=b.stub)
    assert _trips(b, 1) == [("ExecuteStep", 2)]
    # back on the first replica: its cached state expects step 2, so it reads etcd again
    agent.ok("kv.put", {"key": f"rt3c-{uniq}", "value": 3})
    assert _trips(a, 1) == [("ExecuteStep", 2)]
    assert agent.commit().committed


def test_history_is_written_without_a_round_trip_of_its_own(replicas, uniq):
    replica = replicas[0]
    agent = Agent(replica.stub)
    agent.ok("kv.put", {"key": f"rt4-{uniq}", "value": 1})
    failed = agent.step("kv.get", {"key": f"rt4-missing-{uniq}"})
    assert failed.status == pb.STEP_STATUS_ROLLBACK_TRIGGERED  # a local retry: one CAS
    agent.ok("kv.put", {"key": f"rt4b-{uniq}", "value": 2})
    assert agent.rollback(reason="rt4").rolled_back
    history = replica.stub.GetTransactionHistory(
        pb.GetTransactionHistoryRequest(transaction_id=agent.tx))
    assert _trips(replica, 5) == [("ExecuteStep", 1), ("ExecuteStep", 1), ("ExecuteStep", 1),
                                  ("RollbackTransaction", 1), ("GetTransactionHistory", 1)]
    assert (history.status, history.reason) == (pb.TRANSACTION_STATUS_ABORTED, "rt4")
    assert [(s.step_id, s.tool, s.status) for s in history.steps] == [
        (1, "kv.put", pb.STEP_STATUS_SUCCESS), (2, "kv.get", pb.STEP_STATUS_ROLLBACK_TRIGGERED),
        (2, "kv.put", pb.STEP_STATUS_SUCCESS)]


def test_a_commit_on_the_replica_that_took_the_transaction_over_is_one_round_trip(replicas, uniq):
    """The step that moved the transaction to another replica read it whole (it is small),
    so that replica's cache is current and complete: its commit compares on the cached
    revisions and writes, one round trip, no read first."""
    a, b = replicas
    agent = Agent(a.stub)
    agent.ok("kv.put", {"key": f"rt5-{uniq}", "value": 1})
    agent.ok("kv.put", {"key": f"rt5b-{uniq}", "value": 2}, stub=b.stub)
    agent.ok("kv.put", {"key": f"rt5c-{uniq}", "value": 3}, stub=b.stub)
    assert b.stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=agent.tx)).committed
    assert _trips(b, 3) == [("ExecuteStep", 2), ("ExecuteStep", 1), ("CommitTransaction", 1)]
