"""`agenttx bench`: latency and throughput of the real service, with figures.

Without --target it starts its own embedded etcd and one `agenttx serve` process on
loopback, so the numbers include real etcd round trips and fsyncs. Each simulated agent
runs transactions of kv/record/fs steps and commits them; the report gives p50/p95/p99
per RPC, transactions per second, and the service's peak RSS (memory).
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
import threading
import time
import uuid
from collections import defaultdict

import grpc

from ._proto import agenttx_pb2 as pb
from ._proto import agenttx_pb2_grpc as pb_grpc
from .store.embedded import EmbeddedEtcd, free_port


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _peak_rss_kib(pid: int) -> int | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def run(target: str, transactions: int, concurrency: int, steps: int,
        progress: bool = True) -> dict[str, object]:
    channel = grpc.insecure_channel(target)
    stub = pb_grpc.AgentTxServiceStub(channel)
    timings: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()
    counter = {"done": 0, "errors": 0}
    per_worker = [transactions // concurrency + (1 if i < transactions % concurrency else 0)
                  for i in range(concurrency)]

    def timed(name: str, fn, *args):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = fn(*args)
        with lock:
            timings[name].append((time.perf_counter() - t0) * 1000.0)
        return out

    def worker(n: int, count: int) -> None:
        for t in range(count):
            try:
                tx = timed("BeginTransaction", stub.BeginTransaction,
                           pb.BeginTransactionRequest(agent_id=f"bench-{n}")).transaction_id
                for s in range(1, steps + 1):
                    kind = s % 3
                    tag = f"{n}-{t}-{s}-{uuid.uuid4().hex[:6]}"
                    if kind == 1:
                        tool, args = "kv.put", {"key": f"bench/{tag}", "value": {"n": s}}
                    elif kind == 2:
                        tool, args = "record.insert", {"table": "bench", "id": tag,
                                                       "fields": {"s": s}}
                    else:
                        tool, args = "fs.write", {"path": f"bench/{tag}.txt", "contents": tag}
                    resp = timed(f"ExecuteStep {tool}", stub.ExecuteStep, pb.ExecuteStepRequest(
                        transaction_id=tx, step_id=s, tool_name=tool,
                        arguments_json=json.dumps(args)))
                    assert resp.status == pb.STEP_STATUS_SUCCESS, resp.clean_hint
                timed("CommitTransaction", stub.CommitTransaction,
                      pb.CommitTransactionRequest(transaction_id=tx))
            except Exception as exc:  # counted and reported, the run goes on
                with lock:
                    counter["errors"] += 1
                print(f"bench: transaction failed: {exc}", file=sys.stderr)
            with lock:
                counter["done"] += 1

    threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate(per_worker)]
    started = time.perf_counter()
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        time.sleep(1.0)
        if progress:
            print(f"bench: {counter['done']}/{transactions} transactions", file=sys.stderr)
    elapsed = time.perf_counter() - started
    channel.close()
    return {
        "transactions": transactions, "concurrency": concurrency, "steps_per_tx": steps,
        "errors": counter["errors"], "elapsed_s": round(elapsed, 3),
        "tx_per_s": round(transactions / elapsed, 1),
        "steps_per_s": round(transactions * steps / elapsed, 1),
        "latency_ms": {name: {"n": len(v), "p50": round(_percentile(v, 0.5), 2),
                              "p95": round(_percentile(v, 0.95), 2),
                              "p99": round(_percentile(v, 0.99), 2),
                              "mean": round(statistics.fmean(v), 2)}
                       for name, v in sorted(timings.items())},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agenttx bench", description=__doc__)
    parser.add_argument("--target", help="host:port of a running service (default: start one)")
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="steps per transaction")
    parser.add_argument("--json", action="store_true", help="print the report as JSON only")
    ns = parser.parse_args(argv)
    if ns.transactions < 1 or ns.concurrency < 1 or ns.steps < 1:
        parser.error("--transactions, --concurrency and --steps must be at least 1")
    if ns.target:
        report = run(ns.target, ns.transactions, ns.concurrency, ns.steps)
    else:
        with tempfile.TemporaryDirectory(prefix="agenttx-bench-",
                                         dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
            etcd = EmbeddedEtcd(pathlib.Path(d) / "etcd").start()
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "agenttx", "serve", "--listen", f"127.0.0.1:{port}",
                 "--etcd-endpoints", etcd.endpoints[0], "--data-dir", d,
                 "--log-level", "WARNING"], stderr=subprocess.DEVNULL)
            try:
                _wait_ready(f"127.0.0.1:{port}")
                report = run(f"127.0.0.1:{port}", ns.transactions, ns.concurrency, ns.steps)
                report["service_peak_rss_mib"] = round((_peak_rss_kib(proc.pid) or 0) / 1024, 1)
                report["etcd"] = "embedded 3.5.1, data on " + ("tmpfs" if d.startswith("/dev/shm")
                                                               else "disk")
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                etcd.stop()
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['transactions']} transactions x {report['steps_per_tx']} steps, "
              f"{report['concurrency']} agents: {report['tx_per_s']} tx/s, "
              f"{report['steps_per_s']} steps/s, errors {report['errors']}")
        latencies: dict[str, dict[str, float]] = report["latency_ms"]  # type: ignore[assignment]
        for name, lat in latencies.items():
            print(f"  {name:<28} n={lat['n']:<5} p50={lat['p50']:>7} ms  p95={lat['p95']:>7} ms"
                  f"  p99={lat['p99']:>7} ms")
        if "service_peak_rss_mib" in report:
            print(f"  service peak RSS: {report['service_peak_rss_mib']} MiB ({report['etcd']})")
    return 1 if report["errors"] else 0


def _wait_ready(target: str, timeout: float = 30.0) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"service at {target} not ready after {timeout}s")
