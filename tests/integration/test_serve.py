"""`agenttx serve` as a user runs it: embedded etcd by default, graceful SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from agenttx.embedded_etcd import free_port
from agenttx.v1 import agenttx_pb2 as pb
from support.processes import etcds_on
from support.service import Agent, ServiceProcess


def _etcd_children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,ppid,comm"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:]
            if line.split()[1] == str(pid) and "etcd" in line.split()[2]]


@pytest.mark.timeout(120)
def test_serve_without_endpoints_starts_and_stops_an_embedded_etcd(scratch, tmp_path):
    port = free_port()
    data = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "agenttx", "serve", "--listen",
                             f"127.0.0.1:{port}", "--data-dir", str(data)],
                            stderr=subprocess.PIPE, text=True)
    try:
        stub = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                stub = Agent(_stub(f"127.0.0.1:{port}"))
                break
            except grpc.RpcError:
                time.sleep(0.2)
        assert stub is not None, "service did not come up"
        stub.ok("kv.put", {"key": "embedded", "value": True})
        assert stub.commit().committed
        assert (data / "etcd").is_dir() and (data / "sandbox").is_dir()
        etcd_pids = _etcd_children(proc.pid)
        assert len(etcd_pids) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    for pid in etcd_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "embedded etcd" in proc.stderr.read()


@pytest.mark.parametrize("args, message", [
    (["--listen", "0.0.0.0:{port}"], "--allow-unauthenticated"),
    (["--auth", "token", "--auth-tokens-file", "{missing}"], "tokens"),
])
def test_bad_security_settings_refuse_to_start_and_leave_no_etcd_behind(tmp_path, args, message):
    port = free_port()
    argv = [a.format(port=port, missing=tmp_path / "missing.json") for a in args]
    if "--listen" not in argv:
        argv += ["--listen", f"127.0.0.1:{port}"]
    run = subprocess.run([sys.executable, "-m", "agenttx", "serve", "--data-dir",
                          str(tmp_path / "state"), *argv],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "invalid settings" in run.stderr and message in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert etcds_on(tmp_path / "state") == []  # no orphaned embedded etcd
    assert not (tmp_path / "state" / "etcd" / "agenttx-0.pid").exists()


@pytest.mark.parametrize("argv, expected", [
    ([], False), (["--allow-unauthenticated"], True),
    (["--allow-unauthenticated", "true"], True), (["--allow-unauthenticated", "false"], False),
])
def test_boolean_settings_work_as_bare_flags_or_with_a_value(argv, expected):
    import argparse

    from agenttx.commands import serve_flags, settings_from_args

    parser = argparse.ArgumentParser()
    source = serve_flags(parser)
    settings = settings_from_args(source, parser.parse_args(["--listen", "0.0.0.0:1", *argv]))
    assert settings.allow_unauthenticated is expected


def _stub(address: str):
    from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

    return pb_grpc.AgentTxServiceStub(grpc.insecure_channel(address))


def test_sigterm_drains_in_flight_rpcs_before_stopping(etcd, scratch, sandbox):
    svc = ServiceProcess("drain", etcd_endpoints=etcd.endpoints, prefix="/agenttx-drain",
                         fs_root=str(sandbox), workdir=scratch / "drain",
                         env={"AGENTTX_FAILPOINTS": "fs.write.after_intent=sleep(2)"}).start()
    agent = Agent(svc.stub)
    result: dict = {}

    def slow_step():
        try:
            result["resp"] = agent.step("fs.write", {"path": "drain.txt", "contents": "done"})
        except grpc.RpcError as exc:
            result["error"] = exc

    th = threading.Thread(target=slow_step)
    th.start()
    time.sleep(0.8)  # the step is now sleeping between its intent and its rename
    svc.process.send_signal(signal.SIGTERM)
    th.join(timeout=20)
    assert "error" not in result, result.get("error")
    assert result["resp"].status == pb.STEP_STATUS_SUCCESS
    assert (sandbox / "drain.txt").read_text() == "done"
    assert svc.process.wait(timeout=20) == 0
    # new calls are refused once it has stopped
    with pytest.raises(grpc.RpcError) as err:
        svc.stub.BeginTransaction(pb.BeginTransactionRequest(), timeout=2)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_failpoints_armed_by_the_flag_stop_the_replica_at_that_point(etcd, scratch, sandbox):
    """`--failpoints` (the `failpoints` setting) is what arms them, not a side channel."""
    svc = ServiceProcess("armed", etcd_endpoints=etcd.endpoints, prefix="/agenttx-armed",
                         fs_root=str(sandbox), workdir=scratch / "armed",
                         extra_args=["--failpoints", "fs.write.before_intent=crash"]).start()
    try:
        agent = Agent(svc.stub)
        agent.ok("kv.put", {"key": "armed", "value": 1})  # other points stay inert
        with pytest.raises(grpc.RpcError) as err:
            agent.step("fs.write", {"path": "armed.txt", "contents": "never"})
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert svc.process.wait(timeout=20) == -signal.SIGKILL
        assert not (sandbox / "armed.txt").exists()
    finally:
        svc.stop()


@pytest.mark.parametrize("argv, message", [
    (["--failpoints", "fs.write.after_intent=explode"], "failpoints"),
    (["--default-policy-max-local-depth", "17"], "max_local_depth"),
    (["--etcd-timeout-s", "fast"], "etcd_timeout_s"),
])
def test_a_bad_setting_exits_2_naming_it_before_anything_starts(tmp_path, argv, message):
    run = subprocess.run([sys.executable, "-m", "agenttx", "serve", "--data-dir",
                          str(tmp_path / "state"), *argv],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.startswith("agenttx serve: invalid settings")
    assert message in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "state").exists()  # no embedded etcd was started
