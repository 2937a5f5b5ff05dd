"""The idle reaper: aborts and compensates idle transactions, on one replica at a time."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from agenttx.v1 import agenttx_pb2 as pb
from support.service import Agent, ServiceProcess


def _wait_gone(stub, tx: str, timeout: float, idle: float) -> float:
    """Poll more slowly than the idle timeout: every GetTransaction is activity too."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(idle + 1.0)
        try:
            stub.GetTransaction(pb.GetTransactionRequest(transaction_id=tx))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            return time.monotonic() - started
    raise AssertionError(f"transaction {tx} still alive after {timeout}s")


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
        _wait_gone(svc.stub, agent.tx, timeout=20, idle=2)
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
            time.sleep(1.0)
        assert agent.commit().committed
    finally:
        svc.stop()


@pytest.mark.timeout(120)
def test_reaper_fails_over_when_its_replica_is_killed(etcd, scratch, sandbox):
    prefix = f"/agenttx-reaper-{uuid.uuid4().hex[:8]}"
    first = _replica("reaper-1", etcd, scratch, sandbox, prefix, 30).start()
    time.sleep(1.0)  # let the first replica win the reaper election
    second = _replica("reaper-2", etcd, scratch, sandbox, prefix, 2).start()
    try:
        leader_logs = [e for e in first.logs() if e.get("msg") == "leadership acquired"
                       and "reaper" in str(e.get("leader_key"))]
        assert leader_logs, "the first replica should hold the reaper lease"
        # Transactions carry the idle timeout of the replica that began them (2 s).
        agent = Agent(second.stub)
        agent.ok("kv.put", {"key": "failover", "value": 1})
        first.kill()  # SIGKILL: its lease expires after the TTL (10 s)
        took = _wait_gone(second.stub, agent.tx, timeout=40, idle=2)
        assert took < 30
        assert any(e.get("msg") == "idle transaction expired" for e in second.logs())
    finally:
        first.stop()
        second.stop()
