"""Replica CPU per kv.put step and per commit: two source trees side by side, same run.

Why: on a shared machine CPU time per step drifts by half between runs (docs/benchmarks.md),
so "before" and "after" figures taken an hour apart prove nothing. This starts ONE
embedded etcd and two replicas — one importing the service from `--before` (an exported
tree: `git archive <commit> | tar -x -C DIR`), one from this checkout — and measures them
in alternating rounds, so both see the same load:

    .venv/bin/python scripts/ab_step_cpu.py --before /tmp/perf-before

Each round, on each replica: a transaction of `--steps` kv.put steps (CPU time of the
replica per step, from /proc), then `--commits` transactions of 10 steps whose commits
alone are timed (CPU per commit). It prints the median of the rounds for each tree and
the after/before ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import uuid

import grpc

from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from agenttx_bench.perf import _wait_ready, cpu_seconds


def _put(stub: pb_grpc.AgentTxServiceStub, tx: str, step: int) -> None:
    resp = stub.ExecuteStep(pb.ExecuteStepRequest(
        transaction_id=tx, step_id=step, tool_name="kv.put",
        arguments_json=json.dumps({"key": f"ab/{uuid.uuid4().hex}", "value": {"n": step}})))
    if resp.status != pb.STEP_STATUS_SUCCESS:
        raise RuntimeError(resp.clean_hint)


def _begin(stub: pb_grpc.AgentTxServiceStub) -> str:
    return stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="ab")).transaction_id


def _round(stub: pb_grpc.AgentTxServiceStub, pid: int, steps: int, commits: int
           ) -> tuple[float, float]:
    tx = _begin(stub)
    c0 = cpu_seconds(pid)
    for s in range(1, steps + 1):
        _put(stub, tx, s)
    c1 = cpu_seconds(pid)
    stub.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=tx))
    ready = []
    for _ in range(commits):
        tx = _begin(stub)
        for s in range(1, 11):
            _put(stub, tx, s)
        ready.append(tx)
    c2 = cpu_seconds(pid)
    for tx in ready:
        stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx))
    c3 = cpu_seconds(pid)
    assert None not in (c0, c1, c2, c3)
    return (c1 - c0) * 1000 / steps, (c3 - c2) * 1000 / commits  # type: ignore[operator]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=pathlib.Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--commits", type=int, default=60)
    ns = parser.parse_args()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    trees = {"before": f"{ns.before}/service:{ns.before}/client", "after": ""}
    with tempfile.TemporaryDirectory(prefix="agenttx-ab-", dir=shm) as d:
        etcd = EmbeddedEtcd(pathlib.Path(d) / "etcd").start()
        procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        try:
            for name, path in trees.items():
                env = dict(os.environ)
                if path:
                    env["PYTHONPATH"] = path
                target = f"127.0.0.1:{free_port()}"
                data = pathlib.Path(d) / name
                data.mkdir()
                procs[name] = (subprocess.Popen(
                    [sys.executable, "-m", "agenttx", "serve", "--listen", target,
                     "--etcd-endpoints", etcd.endpoints[0], "--data-dir", str(data),
                     "--log-level", "WARNING", "--max-open-transactions", "100000"],
                    stderr=subprocess.DEVNULL, env=env), target)
            channels = {}
            for name, (_, target) in procs.items():
                _wait_ready(target)
                channels[name] = grpc.insecure_channel(target)
            stubs = {n: pb_grpc.AgentTxServiceStub(c) for n, c in channels.items()}
            for name in trees:  # warm up
                _round(stubs[name], procs[name][0].pid, 50, 5)
            got: dict[str, list[tuple[float, float]]] = {n: [] for n in trees}
            for r in range(ns.rounds):
                order = list(trees) if r % 2 == 0 else list(reversed(trees))
                for name in order:
                    got[name].append(_round(stubs[name], procs[name][0].pid, ns.steps,
                                            ns.commits))
            out = {}
            for name, rows in got.items():
                out[name] = {"cpu_ms_per_step": round(statistics.median(s for s, _ in rows), 3),
                             "cpu_ms_per_commit": round(statistics.median(c for _, c in rows), 3),
                             "rounds": [[round(s, 3), round(c, 3)] for s, c in rows]}
            out["after_over_before"] = {
                k: round(out["after"][k] / out["before"][k], 2)
                for k in ("cpu_ms_per_step", "cpu_ms_per_commit")}
            out["loadavg"] = pathlib.Path("/proc/loadavg").read_text().split()[:3]
            print(json.dumps(out, indent=2))
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(timeout=30)
            etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
