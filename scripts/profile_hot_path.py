"""Flame graphs of the replica's hot path: a `kv.put` step and a commit (docs/benchmarks.md).

Why a script: a profile is only comparable with another taken the same way. This starts
an embedded etcd (tmpfs) and one `agenttx serve`, warms it up, then attaches py-spy to
the replica for exactly the phase being profiled:

* `step`: one agent sends `kv.put` steps (a new transaction every 50 steps);
* `commit`: transactions of 10 `kv.put` steps are prepared first (not profiled), then
  only their commits run while py-spy samples.

    .venv/bin/python scripts/profile_hot_path.py --out docs/images/ --tag after

writes `flame-step-<tag>.svg` and `flame-commit-<tag>.svg` (py-spy's flame graph SVG,
`--idle` off: only frames on the CPU). Needs `pip install py-spy`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import grpc

from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc


def _wait_ready(target: str) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 30
    with grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{target} not ready")


def _put(stub: pb_grpc.AgentTxServiceStub, tx: str, step: int) -> None:
    resp = stub.ExecuteStep(pb.ExecuteStepRequest(
        transaction_id=tx, step_id=step, tool_name="kv.put",
        arguments_json=json.dumps({"key": f"p/{uuid.uuid4().hex}", "value": {"n": step}})))
    if resp.status != pb.STEP_STATUS_SUCCESS:
        raise RuntimeError(resp.clean_hint)


def _begin(stub: pb_grpc.AgentTxServiceStub) -> str:
    return stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="profile")).transaction_id


class Profiler:
    def __init__(self, pid: int, out: pathlib.Path, rate: int, fmt: str, native: bool = False) -> None:
        self.proc = subprocess.Popen(
            [shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy"),
             "record", "--pid", str(pid), "--rate", str(rate), "--format", fmt,
             *(["--native"] if native else ["--nonblocking"]), "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> None:
        self.proc.send_signal(2)  # SIGINT: py-spy writes the file and exits
        _, err = self.proc.communicate(timeout=60)
        if self.proc.returncode not in (0, None):
            sys.stderr.write(err.decode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs/images"))
    parser.add_argument("--tag", required=True)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--commits", type=int, default=400)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--format", default="flamegraph", choices=["flamegraph", "raw"],
                        help="raw: collapsed stacks (.txt), for reading the figures")
    parser.add_argument("--native", action="store_true",
                        help="also sample C frames (grpc, uvloop, protobuf)")
    ns = parser.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    ext = "svg" if ns.format == "flamegraph" else "txt"
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="agenttx-profile-", dir=shm) as d:
        etcd = EmbeddedEtcd(pathlib.Path(d) / "etcd").start()
        port = free_port()
        target = f"127.0.0.1:{port}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenttx", "serve", "--listen", target,
             "--etcd-endpoints", etcd.endpoints[0], "--data-dir", d, "--log-level", "WARNING",
             "--max-open-transactions", "100000"], stderr=subprocess.DEVNULL)
        try:
            _wait_ready(target)
            with grpc.insecure_channel(target) as ch:
                stub = pb_grpc.AgentTxServiceStub(ch)
                for _ in range(20):  # warm up
                    tx = _begin(stub)
                    _put(stub, tx, 1)
                    stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx))
                prof = Profiler(proc.pid, ns.out / f"flame-step-{ns.tag}.{ext}", ns.rate,
                                ns.format, ns.native)
                tx, step = _begin(stub), 1
                for _ in range(ns.steps):
                    if step > 50:
                        stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx))
                        tx, step = _begin(stub), 1
                    _put(stub, tx, step)
                    step += 1
                prof.stop()
                ready = []
                for _ in range(ns.commits):
                    tx = _begin(stub)
                    for s in range(1, 11):
                        _put(stub, tx, s)
                    ready.append(tx)
                prof = Profiler(proc.pid, ns.out / f"flame-commit-{ns.tag}.{ext}", ns.rate,
                                ns.format, ns.native)
                for tx in ready:
                    if not stub.CommitTransaction(
                            pb.CommitTransactionRequest(transaction_id=tx)).committed:
                        raise RuntimeError(f"{tx} did not commit")
                prof.stop()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            etcd.stop()
    print(f"wrote {ns.out}/flame-step-{ns.tag}.{ext} and {ns.out}/flame-commit-{ns.tag}.{ext}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
