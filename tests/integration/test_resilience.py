"""etcd outages and member loss, and a replica SIGKILLed mid-transaction."""

from __future__ import annotations

import uuid

import grpc
import pytest

from agenttx.embedded_etcd import EmbeddedEtcd
from agenttx.v1 import agenttx_pb2 as pb
from support.service import Agent, ServiceProcess
from support.waiting import eventually, slack


def _replica(name, endpoints, scratch, sandbox, prefix="/agenttx-res"):
    return ServiceProcess(name, etcd_endpoints=endpoints, prefix=prefix, fs_root=str(sandbox),
                          workdir=scratch / "resilience",
                          extra_args=["--etcd-timeout-s", str(ETCD_TIMEOUT_S)]).start()


ETCD_TIMEOUT_S = 2


def _retry_until_ok(fn):
    """`fn()` once the replica reaches etcd again: a call that meets the dead endpoint
    times out after --etcd-timeout-s and the next one goes to a live one. Only
    UNAVAILABLE is retried."""
    def attempt():
        try:
            return fn()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise  # anything else fails at once
            raise AssertionError(exc.details()) from exc
    return eventually(attempt, slack(2 * ETCD_TIMEOUT_S), "the call succeeds again",
                      retry_on=(AssertionError,))


@pytest.mark.timeout(120)
def test_etcd_outage_answers_unavailable_changes_nothing_and_recovers(scratch, sandbox):
    own = EmbeddedEtcd(scratch / f"etcd-outage-{uuid.uuid4().hex[:6]}").start()
    svc = _replica("outage", own.endpoints, scratch, sandbox)
    try:
        agent = Agent(svc.stub)
        agent.ok("kv.put", {"key": "outage", "value": 1}, context="before")
        own.kill(0)
        for call in (
            lambda: agent.step("kv.put", {"key": "outage", "value": 2}),
            lambda: agent.commit(),
            lambda: agent.get(),
            lambda: svc.stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="x")),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "etcd" in err.value.details()
        agent.next = 2
        own.restart(0)
        state = _retry_until_ok(agent.get)
        # nothing partial: the refused step left no trace, the acknowledged one is intact
        assert state.next_step_id == 2
        assert [c.raw_context for c in state.context] == ["before"]
        assert agent.ok("kv.get", {"key": "outage"}) == {"key": "outage", "value": 1}
        assert agent.commit().steps_committed == 2
    finally:
        svc.stop()
        own.stop()


@pytest.mark.timeout(180)
def test_three_member_cluster_keeps_serving_with_one_member_down(scratch, sandbox):
    cluster = EmbeddedEtcd(scratch / f"etcd-3-{uuid.uuid4().hex[:6]}", members=3).start()
    svc = _replica("three", cluster.endpoints, scratch, sandbox)
    try:
        agent = Agent(svc.stub)
        agent.ok("kv.put", {"key": "three", "value": 1})
        cluster.kill(0)  # the first endpoint the client knows
        def step():
            agent.next = 2
            return agent.ok("record.insert", {"table": "members", "id": 1})
        _retry_until_ok(step)
        assert agent.commit().steps_committed == 2
        other = Agent(svc.stub)
        assert other.ok("kv.get", {"key": "three"})["value"] == 1
        other.commit()
    finally:
        svc.stop()
        cluster.stop()


def test_a_replica_killed_mid_transaction_loses_nothing_acknowledged(etcd, scratch, sandbox):
    prefix = f"/agenttx-kill-{uuid.uuid4().hex[:6]}"
    first = _replica("kill-a", etcd.endpoints, scratch, sandbox, prefix)
    second = _replica("kill-b", etcd.endpoints, scratch, sandbox, prefix)
    try:
        agent = Agent(first.stub)
        path = f"killed-{uuid.uuid4().hex[:6]}.txt"
        agent.ok("fs.write", {"path": path, "contents": "one"}, context="c1")
        agent.ok("kv.put", {"key": path, "value": 1}, context="c2")
        first.kill()
        agent.stub = second.stub
        assert [c.raw_context for c in agent.get().context] == ["c1", "c2"]
        assert agent.ok("fs.read", {"path": path})["contents"] == "one"
        assert agent.commit().steps_committed == 3
        assert (sandbox / path).read_text() == "one"
    finally:
        first.stop()
        second.stop()
