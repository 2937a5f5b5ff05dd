"""The embedded etcd belongs to its service (docs/architecture.md, "The embedded etcd").

`agenttx serve` without `--etcd-endpoints`, as `make serve` runs it: a second service on
the same data dir is refused at once with one line naming the holder; no etcd outlives
its service, whether start-up fails, is interrupted by SIGINT/SIGTERM while etcd comes
up, or the service is SIGKILLed (then the next start stops the survivor, found through
its PID file); and an etcd that is not this data dir's is never touched. Every check of
"which etcd runs" reads /proc, as a person would with `ps`.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from agenttx.embedded_etcd import etcd_data_dir_of, find_etcd_binary, free_port
from support.processes import alive, etcds_on
from support.service import Agent, ServiceProcess
from support.waiting import SLACK, eventually, slack

# The product's promise: refused within 5 s on a quiet machine (docs/architecture.md).
REFUSE_S = 5.0


def pid_file(data_dir: pathlib.Path) -> pathlib.Path:
    return data_dir / "etcd" / "agenttx-0.pid"


def embedded(name: str, data_dir: pathlib.Path, workdir: pathlib.Path,
             env: dict[str, str] | None = None) -> ServiceProcess:
    """A replica that starts its own etcd under `data_dir` (the last --data-dir wins)."""
    return ServiceProcess(name, etcd_endpoints=None, workdir=workdir, env=env,
                          extra_args=["--data-dir", str(data_dir)])


@pytest.mark.timeout(180)
def test_a_second_serve_on_a_held_data_dir_is_refused_in_one_line(scratch: pathlib.Path) -> None:
    work = scratch / "etcd-twice"
    data = work / "state"
    first = embedded("first", data, work).start(timeout=slack(30))
    try:
        [etcd_pid] = etcds_on(data)
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "agenttx", "serve", "--listen", f"127.0.0.1:{free_port()}",
             "--data-dir", str(data)], capture_output=True, text=True, timeout=slack(30))
        elapsed = time.monotonic() - started
        assert second.returncode == 1, second.stderr
        assert second.stdout == ""
        lines = second.stderr.splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0] == (
            f"agenttx serve: {data} is in use by agenttx serve (pid {first.process.pid}, "
            f"listening on {first.address}, its etcd on "
            f"{json.loads(pid_file(data).read_text())['client_url']}); stop it, or give this "
            "one another --data-dir")
        assert elapsed < REFUSE_S * SLACK, f"refused after {elapsed:.1f}s"
        # the first one never noticed: same etcd, still serving, still committing
        assert etcds_on(data) == [etcd_pid]
        agent = Agent(first.stub)
        agent.ok("kv.put", {"key": "still-mine", "value": 1})
        assert agent.commit().committed
    finally:
        assert first.stop() == 0
    assert etcds_on(data) == []
    assert not pid_file(data).exists()


@pytest.mark.timeout(240)
def test_an_etcd_orphaned_by_a_killed_service_is_stopped_by_the_next_start(
        scratch: pathlib.Path) -> None:
    work = scratch / "etcd-orphan"
    data = work / "state"
    first = embedded("killed", data, work).start(timeout=slack(30))
    agent = Agent(first.stub)
    agent.ok("kv.put", {"key": "before-the-kill", "value": "kept"})
    assert agent.commit().committed
    first.kill()
    [orphan] = etcds_on(data)  # SIGKILL leaves the etcd running: nobody could stop it
    assert json.loads(pid_file(data).read_text())["pid"] == orphan

    second = embedded("next", data, work).start(timeout=slack(30))
    try:
        eventually(lambda: not alive(orphan), slack(10), "the orphaned etcd has exited")
        [fresh] = etcds_on(data)
        assert fresh != orphan and fresh == json.loads(pid_file(data).read_text())["pid"]
        stopped = [r for r in second.logs() if r["msg"] == "stopping an etcd left running by "
                   "an earlier agenttx serve"]
        assert [(r["level"], r["pid"], r["data_dir"]) for r in stopped] == \
            [("warning", orphan, str((data / "etcd" / "member-0").resolve()))]
        # the new etcd runs on the same files: what was committed before the kill is there
        reader = Agent(second.stub)
        assert reader.ok("kv.get", {"key": "before-the-kill"})["value"] == "kept"
    finally:
        assert second.stop() == 0
    assert etcds_on(data) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_etcd_is_starting_leaves_no_etcd(scratch: pathlib.Path,
                                                         sig: signal.Signals) -> None:
    work = scratch / f"etcd-interrupted-{sig.name}"
    data = work / "state"
    work.mkdir(parents=True)
    # The real etcd, started 60 s late: the service is caught while its etcd comes up.
    slow = work / "slow-etcd"
    slow.write_text("#!/bin/sh\ntrap 'kill $waiting; exit 143' TERM\n"
                    f"sleep 60 & waiting=$!\nwait $waiting\nexec {find_etcd_binary()} \"$@\"\n")
    slow.chmod(0o755)
    log = work / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenttx", "serve", "--listen", f"127.0.0.1:{free_port()}",
             "--data-dir", str(data), "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "AGENTTX_ETCD_BINARY": str(slow)})
    starting = 0
    try:
        starting = eventually(lambda: pid_file(data).exists() and
                              json.loads(pid_file(data).read_text())["pid"],
                              slack(30), "the service has spawned its etcd")
        assert alive(starting)
        proc.send_signal(sig)
        assert proc.wait(timeout=slack(10)) == 0, log.read_text()[-2000:]
        assert not alive(starting)  # so it never gets to exec the etcd binary either
    finally:  # whatever failed, leave nothing behind
        if proc.poll() is None:
            proc.kill()
        if starting and alive(starting):
            os.kill(starting, signal.SIGTERM)
    assert etcds_on(data) == []
    assert not pid_file(data).exists()
    messages = [json.loads(line)["msg"] for line in log.read_text().splitlines()
                if line.startswith("{")]
    assert "stopped while starting" in messages and "Traceback" not in log.read_text()


@pytest.mark.timeout(120)
def test_a_pid_file_naming_another_etcd_leaves_that_etcd_alone(scratch: pathlib.Path,
                                                               etcd) -> None:
    work = scratch / "etcd-not-mine"
    data = work / "state"
    other = etcd.members[0].process.pid  # the session's etcd, on another data dir
    pid_file(data).parent.mkdir(parents=True)
    pid_file(data).write_text(json.dumps({"pid": other, "client_url": "http://x",
                                          "data_dir": str(data / "etcd" / "member-0")}))
    svc = embedded("beside", data, work).start(timeout=slack(30))
    try:
        assert alive(other) and etcd_data_dir_of(other) == str(etcd.members[0].data_dir)
        [own] = etcds_on(data)
        assert own != other and json.loads(pid_file(data).read_text())["pid"] == own
        assert not any(r["msg"].startswith("stopping an etcd") for r in svc.logs())
    finally:
        assert svc.stop() == 0
    assert alive(other)
    etcd.wait_healthy(timeout=slack(5))
