"""`agenttx serve --workers N` (agenttx.supervisor): N full replicas on one port.

What a user notices: one address answers from two processes (two replica ids in the
per-RPC log lines, two pids), a transaction's steps land on either worker and still
commit, each worker's metrics are scrapable on its own port (port + i), SIGTERM to the
parent drains every worker and the parent exits 0, and a worker killed outright is
replaced under a new replica id."""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import grpc
import pytest

from agenttx.embedded_etcd import free_port
from agenttx.testing import ServiceProcess
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from support.waiting import eventually, slack

PREFIX = "/agenttx-workers"
# The harness gives its replicas --grace-period-s 5: how long a worker drains.
GRACE_S = 5.0


def _serving(svc: ServiceProcess) -> dict[str, int]:
    """replica id -> pid, for each worker that logged that it serves."""
    return {e["replica"]: e["pid"] for e in svc.logs() if e.get("msg") == "agenttx serving"}


def _rpc_replicas(svc: ServiceProcess) -> set[str]:
    return {e["replica"] for e in svc.logs() if e.get("msg") == "rpc"}


@pytest.fixture(scope="module")
def workers(etcd, scratch):
    metrics_port = free_port()
    while free_port() == metrics_port + 1:  # port + 1 is taken by worker 1: keep it free
        metrics_port = free_port()
    svc = ServiceProcess("wk", etcd_endpoints=etcd.endpoints, prefix=PREFIX,
                         workdir=scratch / "workers",
                         extra_args=["--workers", "2", "--metrics-listen",
                                     f"127.0.0.1:{metrics_port}"])
    svc.metrics_port = metrics_port  # type: ignore[attr-defined]
    svc.start()
    eventually(lambda: len(_serving(svc)) == 2, slack(10), "both workers serving")
    yield svc
    svc.stop(timeout=GRACE_S + 30)


def test_two_workers_serve_one_port_from_two_processes(workers):
    serving = _serving(workers)
    assert set(serving) == {"wk-w0", "wk-w1"}
    parent = workers.process.pid
    assert parent not in serving.values() and len(set(serving.values())) == 2
    for pid in serving.values():
        assert open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1] == str(parent)
    listening = {e["port"] for e in workers.logs() if e.get("msg") == "agenttx serving"}
    assert listening == {workers.port}

    def both_answer() -> bool:
        # each new channel is a new connection, which the kernel hands to either worker
        with grpc.insecure_channel(workers.address,
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            pb_grpc.AgentTxServiceStub(ch).BeginTransaction(
                pb.BeginTransactionRequest(agent_id="spread"), timeout=10)
        return _rpc_replicas(workers) == {"wk-w0", "wk-w1"}

    eventually(both_answer, slack(20), "BeginTransaction answered by both workers")


def test_a_transaction_whose_steps_land_on_either_worker_commits(workers):
    def channel() -> grpc.Channel:
        return grpc.insecure_channel(workers.address,
                                     options=[("grpc.use_local_subchannel_pool", 1)])

    with channel() as ch:
        tx = pb_grpc.AgentTxServiceStub(ch).BeginTransaction(
            pb.BeginTransactionRequest(agent_id="either"), timeout=10).transaction_id
    step = 1
    while len({e["replica"] for e in workers.logs()
               if e.get("msg") == "rpc" and e.get("tx") == tx
               and e.get("rpc") == "ExecuteStep"}) < 2:
        assert step <= 60, "60 connections all reached one worker"
        with channel() as ch:  # a new connection per step
            resp = pb_grpc.AgentTxServiceStub(ch).ExecuteStep(pb.ExecuteStepRequest(
                transaction_id=tx, step_id=step, tool_name="kv.put",
                arguments_json=json.dumps({"key": f"either-{tx}-{step}", "value": step})),
                timeout=10)
        assert (resp.status, resp.next_step_id) == (pb.STEP_STATUS_SUCCESS, step + 1)
        step += 1
    with channel() as ch:
        stub = pb_grpc.AgentTxServiceStub(ch)
        done = stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx), timeout=10)
        assert (done.committed, done.steps_committed) == (True, step - 1)
        got = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="read"), timeout=10)
        read = stub.ExecuteStep(pb.ExecuteStepRequest(
            transaction_id=got.transaction_id, step_id=1, tool_name="kv.get",
            arguments_json=json.dumps({"key": f"either-{tx}-1"})), timeout=10)
    assert json.loads(read.output_json) == {"key": f"either-{tx}-1", "value": 1}


def _begins_counted(port: int) -> float:
    """agenttx_rpc_duration_seconds_count{rpc="BeginTransaction",code="OK"} on one port."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith("agenttx_rpc_duration_seconds_count{") and \
                'rpc="BeginTransaction"' in line and 'code="OK"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_each_worker_serves_its_own_metrics_on_port_plus_its_index(workers):
    """Each worker's /metrics counts exactly the calls that worker answered (its per-RPC
    log lines), so summing the workers' scrapes is the service's total."""
    for _ in range(6):
        with grpc.insecure_channel(workers.address,
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            pb_grpc.AgentTxServiceStub(ch).BeginTransaction(
                pb.BeginTransactionRequest(agent_id="metrics"), timeout=10)
    base = workers.metrics_port

    def agree() -> bool:
        logged = [sum(1 for e in workers.logs() if e.get("msg") == "rpc"
                      and e.get("rpc") == "BeginTransaction" and e.get("replica") == f"wk-w{i}")
                  for i in range(2)]
        return [_begins_counted(base + i) for i in range(2)] == [float(n) for n in logged] \
            and all(logged)

    eventually(agree, slack(5), "each worker's metrics count its own calls",
               retry_on=(AssertionError, OSError))


def test_a_worker_killed_outright_is_replaced_under_a_new_replica_id(workers):
    victim = _serving(workers)["wk-w1"]
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: "wk-w1.1" in _serving(workers), slack(15),
               "worker 1 restarted as wk-w1.1")
    died = [e for e in workers.logs() if e.get("msg") == "worker died; restarting it under "
            "a new replica id"]
    assert [(e["worker"], e["replica"], e["exit_code"]) for e in died] == [
        (1, "wk-w1", -signal.SIGKILL)]


def test_sigterm_to_the_parent_drains_both_workers_and_exits_zero(workers):
    pids = list(_serving(workers).values())
    assert workers.stop(signal.SIGTERM, timeout=GRACE_S + 30) == 0
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    stopped = [e["replica"] for e in workers.logs() if e.get("msg") == "stopped"]
    assert sorted(stopped) == ["wk-w0", "wk-w1.1"]  # every live worker drained
    assert any(e.get("msg") == "workers stopped" for e in workers.logs())


def test_a_worker_that_cannot_start_stops_the_service_with_an_error(etcd, scratch, tmp_path):
    import subprocess
    import sys

    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "agenttx", "serve", "--workers", "2", "--listen",
         f"127.0.0.1:{port}", "--etcd-endpoints", ",".join(etcd.endpoints), "--etcd-prefix",
         PREFIX, "--data-dir", str(tmp_path), "--tls-cert-file", str(tmp_path / "missing.pem"),
         "--tls-key-file", str(tmp_path / "missing.key"), "--log-format", "json"],
        capture_output=True, text=True, timeout=slack(30))
    assert done.returncode != 0
    failed = [json.loads(line) for line in done.stderr.splitlines()
              if '"worker could not start' in line]
    assert failed and all(e["exit_code"] != 0 for e in failed)
