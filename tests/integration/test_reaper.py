"""The idle reaper: aborts and compensates idle transactions, on one replica at a time."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from agenttx.v1 import agenttx_pb2 as pb
from support.service import Agent, ServiceProcess
from support.waiting import eventually, slack

LEADER_TTL_S = 10  # --leader-ttl-s (default): a killed leader's lease expires after it


def _reaper_interval(idle: float) -> float:
    """How often the reaper leader sweeps: a tenth of the idle timeout, at least 0.2 s."""
    return max(0.2, idle / 10)


def _wait_gone(stub, tx: str, timeout: float) -> None:
    """Wait for the reaper to expire `tx`. Reads its history, which is not activity
    (a GetTransaction would be, and would keep it alive)."""
    def expired() -> bool:
        history = stub.GetTransactionHistory(pb.GetTransactionHistoryRequest(transaction_id=tx))
        return history.status == pb.TRANSACTION_STATUS_EXPIRED
    eventually(expired, timeout, f"the reaper expires {tx}")
    with pytest.raises(grpc.RpcError) as gone:
        stub.GetTransaction(pb.GetTransactionRequest(transaction_id=tx))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def _replica(name, etcd, scratch, sandbox, prefix, idle):
    return ServiceProcess(name, etcd_endpoints=etcd.endpoints, prefix=prefix,
                          fs_root=str(sandbox), workdir=scratch / "reaper",
                          extra_args=["--tx-idle-timeout-s", str(idle)])


def test_idle_transaction_is_aborted_and_its_file_write_undone(etcd, scratch, sandbox):
    prefix = f"/agenttx-reaper-{uuid.uuid4().hex[:8]}"
    svc = _replica("reaper-solo", etcd, scratch, sandbox, prefix, 2).start()
    try:
        agent = Agent(svc.stub)
        name = f"reaped-{uuid.uuid4().hex[:8]}.txt"
        agent.ok("fs.write", {"path": name, "contents": "temporary"})
        agent.ok("kv.put", {"key": name, "value": 1})
        assert (sandbox / name).read_text() == "temporary"
        _wait_gone(svc.stub, agent.tx, slack(2 + _reaper_interval(2)))
        assert not (sandbox / name).exists()
        # the lock on the path was released with it: another transaction may write there
        other = Agent(svc.stub)
        other.ok("fs.write", {"path": name, "contents": "mine"})
        other.commit()
        assert (sandbox / name).read_text() == "mine"
    finally:
        svc.stop()


def test_activity_keeps_a_transaction_alive(etcd, scratch, sandbox):
    prefix = f"/agenttx-reaper-{uuid.uuid4().hex[:8]}"
    svc = _replica("reaper-busy", etcd, scratch, sandbox, prefix, 3).start()
    try:
        agent = Agent(svc.stub)
        for i in range(6):  # 6 x 1 s of steps, each under the 3 s idle timeout
            agent.ok("kv.put", {"key": f"busy-{i}", "value": i})
            # The point of the test: time passes (twice the idle timeout in all) while
            # the steps keep coming; no condition can stand in for it.
            time.sleep(1.0)
        assert agent.commit().committed
    finally:
        svc.stop()


@pytest.mark.timeout(120)
def test_reaper_fails_over_when_its_replica_is_killed(etcd, scratch, sandbox):
    prefix = f"/agenttx-reaper-{uuid.uuid4().hex[:8]}"
    first = _replica("reaper-1", etcd, scratch, sandbox, prefix, 30).start()
    second = None
    try:
        # the first replica wins the reaper election on its first pass
        eventually(lambda: [e for e in first.logs() if e.get("msg") == "leadership acquired"
                            and "reaper" in str(e.get("leader_key"))],
                   slack(_reaper_interval(30)), "the first replica holds the reaper lease")
        second = _replica("reaper-2", etcd, scratch, sandbox, prefix, 2).start()
        # Transactions carry the idle timeout of the replica that began them (2 s).
        agent = Agent(second.stub)
        agent.ok("kv.put", {"key": "failover", "value": 1})
        first.kill()  # SIGKILL: its lease expires after the TTL
        # the second replica takes the lease over once it expired, then expires the
        # transaction on its next sweep
        _wait_gone(second.stub, agent.tx, slack(LEADER_TTL_S + 2 + _reaper_interval(2)))
        assert any(e.get("msg") == "idle transaction expired" for e in second.logs())
    finally:
        first.stop()
        if second is not None:
            second.stop()
