"""`agenttx bench`: what a step, a commit and a workflow cost, as ratios to baselines
measured in the same run on the same machine.

Absolute timings drift on a shared machine, so every figure is put next to two
baselines measured in the same process against the same etcd, moments apart:

* `cas`: one raw etcd compare-and-swap (a Txn comparing a key's mod_revision and
  putting it) from Python through `aetcd`'s gRPC stubs, nothing of AgentTx in between
  (a benchmark is a user, not a part: docs/benchmarks.md);
* `empty_grpc`: one empty gRPC call (grpc.health.v1 Check) into a grpc.aio server in
  its own process, through the same client library the benchmark uses for AgentTx.

`floor = empty_grpc + cas` is what any replica that answers over gRPC and writes etcd
once must cost; the targets are ratios to it (docs/benchmarks.md).

Without --target it starts its own embedded etcd (data on tmpfs when available) and one
`agenttx serve` process, and reads the replica's CPU time and memory from /proc.
Phases: the baselines; one agent running 10-step workflows (begin, 10 kv.put, commit);
eight agents running mixed steps; one long transaction (p50 by step index, commit with
N live steps vs 10); many transactions (replica RSS over time).
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Callable
from typing import Any

import grpc

from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": round(percentile(values, 0.5), 3),
            "p99": round(percentile(values, 0.99), 3),
            "mean": round(statistics.fmean(values), 3) if values else 0.0}


def cpu_seconds(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def progress(text: str, enabled: bool) -> None:
    if enabled:
        print(f"bench: {text}", file=sys.stderr, flush=True)


# ---- baselines ---------------------------------------------------------------------------

async def _cas(kv: Any, key: bytes, revision: int, value: bytes) -> int:
    """One compare-and-swap: put `value` if `key`'s mod_revision is still `revision`;
    the revision it wrote. Raw `etcdserverpb` Txn through aetcd's stub: aetcd's own
    `transaction()` drops the response header, and with it the revision."""
    from aetcd import rpc

    resp = await kv.Txn(rpc.TxnRequest(
        compare=[rpc.Compare(key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                             mod_revision=revision)],
        success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))]), timeout=10)
    if not resp.succeeded:
        raise RuntimeError(f"CAS on {key!r} lost: nothing else writes that key")
    return int(resp.header.revision)


def measure_cas(endpoint: str, n: int, concurrency: int, seconds: float) -> dict[str, Any]:
    """Raw etcd CAS from Python: sequential latency, then throughput with `concurrency`
    clients sharing one connection, through `aetcd` directly."""
    import aetcd

    host, _, port = endpoint.split("://", 1)[-1].rstrip("/").rpartition(":")

    async def run() -> dict[str, Any]:
        async with aetcd.Client(host, int(port), timeout=10) as etcd:
            kv = etcd.kvstub
            key = f"/agenttx-bench-cas/{uuid.uuid4().hex}".encode()
            rev = (await etcd.put(key, b"0")).header.revision
            times: list[float] = []
            for i in range(n):
                t0 = time.perf_counter()
                rev = await _cas(kv, key, rev, str(i).encode())
                times.append((time.perf_counter() - t0) * 1000)
            done = 0
            stop_at = time.perf_counter() + seconds

            async def client(c: int) -> None:
                nonlocal done
                k = key + f"/{c}".encode()
                r = (await etcd.put(k, b"0")).header.revision
                while time.perf_counter() < stop_at:
                    r = await _cas(kv, k, r, b"x")
                    done += 1

            started = time.perf_counter()
            await asyncio.gather(*(client(c) for c in range(concurrency)))
            elapsed = time.perf_counter() - started
        return {"latency_ms": summary(times), "concurrency": concurrency,
                "per_s": round(done / elapsed, 1)}

    return asyncio.run(run())


_EMPTY_SERVER = """
import asyncio, sys, grpc
from grpc_health.v1 import health, health_pb2_grpc
async def main():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


def measure_empty_grpc(n: int) -> dict[str, Any]:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-c", _EMPTY_SERVER, target],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        with grpc.insecure_channel(target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            req = health_pb2.HealthCheckRequest()
            for _ in range(50):
                stub.Check(req, timeout=5)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                stub.Check(req, timeout=5)
                times.append((time.perf_counter() - t0) * 1000)
        return {"latency_ms": summary(times)}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---- AgentTx workloads ---------------------------------------------------------------------

class Timings:
    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()

    def call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        with self.lock:
            self.ms[name].append((time.perf_counter() - t0) * 1000)
        return out


def _step(stub: Any, t: Timings, tx: str, step: int, tool: str, args: dict[str, Any],
          name: str | None = None) -> None:
    resp = t.call(name or f"ExecuteStep {tool}", stub.ExecuteStep, pb.ExecuteStepRequest(
        transaction_id=tx, step_id=step, tool_name=tool, arguments_json=json.dumps(args)))
    if resp.status != pb.STEP_STATUS_SUCCESS:
        raise RuntimeError(f"step {step} failed: {resp.error_category}: {resp.clean_hint}")


def workflows(stub: Any, count: int, steps: int, pid: int | None, show: bool) -> dict[str, Any]:
    """One agent: `count` workflows of begin, `steps` kv.put steps, commit."""
    t = Timings()
    for _ in range(5):  # warm up
        tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="warm")).transaction_id
        _step(stub, Timings(), tx, 1, "kv.put", {"key": f"warm/{uuid.uuid4().hex}", "value": 1})
        stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx))
    cpu0, started = cpu_seconds(pid), time.perf_counter()
    for w in range(count):
        tx = t.call("BeginTransaction", stub.BeginTransaction,
                    pb.BeginTransactionRequest(agent_id="bench-1")).transaction_id
        for s in range(1, steps + 1):
            _step(stub, t, tx, s, "kv.put", {"key": f"wf/{uuid.uuid4().hex}", "value": {"n": s}})
        t.call("CommitTransaction", stub.CommitTransaction,
               pb.CommitTransactionRequest(transaction_id=tx))
        if show and (w + 1) % max(1, count // 4) == 0:
            progress(f"workflows {w + 1}/{count}", show)
    elapsed = time.perf_counter() - started
    cpu1 = cpu_seconds(pid)
    calls = count * (steps + 2)
    return {"workflows": count, "steps_per_workflow": steps, "elapsed_s": round(elapsed, 3),
            "workflows_per_s": round(count / elapsed, 1),
            "latency_ms": {k: summary(v) for k, v in sorted(t.ms.items())},
            "replica_cpu_ms_per_rpc": round((cpu1 - cpu0) * 1000 / calls, 3)
            if cpu0 is not None and cpu1 is not None else None}


def step_cpu(stub: Any, steps: int, pid: int | None) -> float | None:
    """Replica CPU per kv.put step: one transaction, `steps` steps, CPU time delta."""
    tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="cpu")).transaction_id
    cpu0 = cpu_seconds(pid)
    for s in range(1, steps + 1):
        _step(stub, Timings(), tx, s, "kv.put", {"key": f"cpu/{uuid.uuid4().hex}", "value": s})
    cpu1 = cpu_seconds(pid)
    stub.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=tx))
    if cpu0 is None or cpu1 is None:
        return None
    return round((cpu1 - cpu0) * 1000 / steps, 3)


def concurrent(stub: Any, agents: int, transactions: int, steps: int, show: bool,
               target: str | None = None) -> dict[str, Any]:
    """`agents` threads running transactions of mixed kv/record/fs steps. With `target`,
    each agent opens its own connection (as separate agent processes would), so a
    service of several workers on one port (`agenttx serve --workers N`) sees them
    spread by the kernel; without it they share `stub`'s one connection."""
    t = Timings()
    errors = [0]
    per_agent = [transactions // agents + (1 if i < transactions % agents else 0)
                 for i in range(agents)]

    def worker(n: int, count: int) -> None:
        own = None
        stub_ = stub
        if target is not None:
            own = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            stub_ = pb_grpc.AgentTxServiceStub(own)
        try:
            transactions_of(stub_, n, count)
        finally:
            if own is not None:
                own.close()

    def transactions_of(stub: Any, n: int, count: int) -> None:
        for i in range(count):
            try:
                tx = t.call("BeginTransaction", stub.BeginTransaction,
                            pb.BeginTransactionRequest(agent_id=f"bench-{n}")).transaction_id
                for s in range(1, steps + 1):
                    tag = f"{n}-{i}-{s}-{uuid.uuid4().hex[:6]}"
                    tool, args = (("kv.put", {"key": f"c/{tag}", "value": s}) if s % 3 == 1 else
                                  ("record.insert", {"table": "bench", "id": tag,
                                                     "fields": {"s": s}}) if s % 3 == 2 else
                                  ("fs.write", {"path": f"bench/{tag}.txt", "contents": tag}))
                    _step(stub, t, tx, s, tool, args)
                t.call("CommitTransaction", stub.CommitTransaction,
                       pb.CommitTransactionRequest(transaction_id=tx))
            except Exception as exc:  # counted and reported; the run goes on
                errors[0] += 1
                print(f"bench: transaction failed: {exc}", file=sys.stderr)

    threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate(per_agent)]
    started = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - started
    n_steps = sum(len(v) for k, v in t.ms.items() if k.startswith("ExecuteStep"))
    progress(f"{agents} agents: {transactions} transactions in {elapsed:.1f}s", show)
    return {"agents": agents, "transactions": transactions, "steps_per_tx": steps,
            "errors": errors[0], "elapsed_s": round(elapsed, 3),
            "tx_per_s": round(transactions / elapsed, 1),
            "steps_per_s": round(n_steps / elapsed, 1),
            "latency_ms": {k: summary(v) for k, v in sorted(t.ms.items())}}


def long_transaction(stub: Any, steps: int, show: bool) -> dict[str, Any]:
    """p50 of a kv.put step by step index, and commit with `steps` vs 10 live steps."""
    def run(n: int, keys: int | None = None) -> tuple[list[float], float]:
        """n kv.put steps (over `keys` distinct keys; each its own when None), commit."""
        tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="long")).transaction_id
        t = Timings()
        base = uuid.uuid4().hex
        for s in range(1, n + 1):
            key = f"long/{base}/{s % keys}" if keys else f"long/{uuid.uuid4().hex}"
            _step(stub, t, tx, s, "kv.put", {"key": key, "value": s}, name="step")
            if show and s % 100 == 0:
                progress(f"long transaction: step {s}/{n}", show)
        t0 = time.perf_counter()
        stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx))
        return t.ms["step"], (time.perf_counter() - t0) * 1000

    commits_small = [run(10)[1] for _ in range(7)]
    step_ms, commit_long = run(steps)
    # the same 10-key write set reached through `steps` steps: commit is linear in the
    # write set, not in the steps (docs/benchmarks.md)
    same_keys = [run(steps, keys=10)[1] for _ in range(3)]
    buckets: dict[str, dict[str, float]] = {}
    edges = list(range(0, steps, 10))
    for lo in edges:
        hi = min(lo + 10, steps)
        buckets[f"{lo + 1}-{hi}"] = {"p50": round(percentile(step_ms[lo:hi], 0.5), 3)}
    first = percentile(step_ms[:10], 0.5)
    last = percentile(step_ms[-10:], 0.5)
    commit_10 = percentile(commits_small, 0.5)
    return {"steps": steps, "p50_by_step_ms": buckets,
            "last_over_first_p50": round(last / first, 2) if first else None,
            "commit_10_ms": round(commit_10, 3), f"commit_{steps}_ms": round(commit_long, 3),
            "commit_long_over_10": round(commit_long / commit_10, 2) if commit_10 else None,
            f"commit_{steps}_steps_10_keys_ms": round(percentile(same_keys, 0.5), 3),
            "commit_long_same_keys_over_10": round(percentile(same_keys, 0.5) / commit_10, 2)
            if commit_10 else None}


def rss_over(stub: Any, transactions: int, pid: int | None, show: bool) -> dict[str, Any]:
    samples: list[float] = []
    for i in range(transactions):
        tx = stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="rss")).transaction_id
        _step(stub, Timings(), tx, 1, "kv.put", {"key": f"rss/{i % 100}", "value": i})
        stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx))
        if (i + 1) % max(1, transactions // 20) == 0:
            rss = rss_mib(pid)
            if rss is not None:
                samples.append(rss)
            progress(f"rss: {i + 1}/{transactions} transactions, {rss} MiB", show)
    if not samples:
        return {"transactions": transactions}
    settled = samples[len(samples) // 4:]  # after warm-up
    return {"transactions": transactions, "rss_mib_samples": samples,
            "rss_spread_after_warmup": round((max(settled) - min(settled)) / min(settled), 3)}


# ---- report ----------------------------------------------------------------------------------

def ratios(report: dict[str, Any]) -> dict[str, Any]:
    base = report.get("baseline")
    if not base:
        return {}
    cas = base["cas"]["latency_ms"]["p50"]
    floor = cas + base["empty_grpc"]["latency_ms"]["p50"]
    out: dict[str, Any] = {"cas_p50_ms": cas, "floor_p50_ms": round(floor, 3)}
    wf = report.get("workflows", {}).get("latency_ms", {})
    per_rpc = {}
    for name, lat in wf.items():
        per_rpc[name] = {"p50_over_cas": round(lat["p50"] / cas, 2),
                         "p99_over_cas": round(lat["p99"] / cas, 2),
                         "p50_over_floor": round(lat["p50"] / floor, 2),
                         "p99_over_p50": round(lat["p99"] / lat["p50"], 2) if lat["p50"] else None}
    out["per_rpc"] = per_rpc
    conc = report.get("concurrent")
    if conc:
        out["steps_per_s_over_cas_per_s"] = round(conc["steps_per_s"] / base["cas"]["per_s"], 3)
    peers = report.get("peers")
    if peers and wf.get("ExecuteStep kv.put"):
        out["systems"] = systems(report, cas)
    return out


def systems(report: dict[str, Any], cas: float) -> dict[str, Any]:
    """Every system's workflows/s and step p50, each p50 as a ratio to the same raw etcd
    CAS, AgentTx first; a skipped peer keeps its reason."""
    wf = report["workflows"]
    agenttx_per_s = wf["workflows_per_s"]
    rows: dict[str, Any] = {"agenttx": {
        "workflows_per_s": agenttx_per_s,
        "step_p50_ms": wf["latency_ms"]["ExecuteStep kv.put"]["p50"],
        "step_p50_over_cas": round(wf["latency_ms"]["ExecuteStep kv.put"]["p50"] / cas, 2)}}
    for name, peer in report["peers"].items():
        if "skipped" in peer:
            rows[name] = {"skipped": peer["skipped"]}
            continue
        rows[name] = {"workflows_per_s": peer["per_s"], "step_p50_ms": peer["step_ms"]["p50"],
                      "step_p50_over_cas": round(peer["step_ms"]["p50"] / cas, 2),
                      "agenttx_workflows_per_s_over_this": round(agenttx_per_s / peer["per_s"], 2)
                      if peer["per_s"] else None}
    return rows


def print_report(r: dict[str, Any]) -> None:
    base = r.get("baseline")
    if base:
        c, e = base["cas"], base["empty_grpc"]
        print(f"baseline  raw etcd CAS        p50 {c['latency_ms']['p50']:.3f} ms  p99 "
              f"{c['latency_ms']['p99']:.3f} ms  {c['per_s']:.0f}/s with {c['concurrency']} clients")
        print(f"baseline  empty gRPC call     p50 {e['latency_ms']['p50']:.3f} ms  p99 "
              f"{e['latency_ms']['p99']:.3f} ms")
        print(f"floor     gRPC + CAS          p50 {r['ratios']['floor_p50_ms']:.3f} ms")
    wf = r.get("workflows")
    if wf:
        print(f"1 agent   {wf['workflows']} workflows of begin + {wf['steps_per_workflow']} "
              f"kv.put + commit: {wf['workflows_per_s']} workflows/s")
        for name, lat in wf["latency_ms"].items():
            rat = r.get("ratios", {}).get("per_rpc", {}).get(name, {})
            extra = (f"  = {rat['p50_over_floor']}x floor, {rat['p50_over_cas']}x CAS; "
                     f"p99/p50 {rat['p99_over_p50']}") if rat else ""
            print(f"          {name:<22} p50 {lat['p50']:>7.3f} ms  p99 {lat['p99']:>7.3f} ms{extra}")
    if r.get("replica_cpu_ms_per_step") is not None:
        print(f"replica   CPU per kv.put step {r['replica_cpu_ms_per_step']} ms")
    conc = r.get("concurrent")
    if conc:
        ratio = r.get("ratios", {}).get("steps_per_s_over_cas_per_s")
        print(f"{conc['agents']} agents  {conc['steps_per_s']} steps/s, {conc['tx_per_s']} tx/s, "
              f"errors {conc['errors']}" + (f"  ({ratio:.0%} of raw CAS/s)" if ratio else ""))
    long = r.get("long")
    if long:
        print(f"long tx   {long['steps']} steps: p50 of the last 10 / first 10 = "
              f"{long['last_over_first_p50']}; commit of {long['steps']} live steps / of 10: "
              f"{long['commit_long_same_keys_over_10']} over the same 10 keys, "
              f"{long['commit_long_over_10']} with {long['steps']} distinct keys "
              "(linear in the write set)")
    systems_ = r.get("ratios", {}).get("systems")
    if systems_:
        print("peers     the same workflow (begin + 10 writes + commit, 1 agent), same run:")
        for name, row in systems_.items():
            if "skipped" in row:
                print(f"          {name:<20} skipped: {row['skipped']}")
                continue
            vs = row.get("agenttx_workflows_per_s_over_this")
            print(f"          {name:<20} {row['workflows_per_s']:>6} workflows/s  step p50 "
                  f"{row['step_p50_ms']:.3f} ms = {row['step_p50_over_cas']}x CAS"
                  + (f"  (AgentTx: {vs}x its workflows/s)" if vs is not None else ""))
    wk = r.get("workers")
    if wk:
        print(f"workers   {r['concurrent']['agents']} agents, one connection each: "
              f"{wk['steps_per_s_1_worker']} steps/s with 1 worker, "
              f"{wk['concurrent']['steps_per_s']} with --workers {wk['workers']} "
              f"= {wk['ratio']}x, errors {wk['concurrent']['errors']}")
    rss = r.get("rss")
    if rss and "rss_mib_samples" in rss:
        s = rss["rss_mib_samples"]
        print(f"memory    {rss['transactions']} transactions: replica RSS {s[0]} -> {s[-1]} MiB, "
              f"spread after warm-up {rss['rss_spread_after_warmup']:.1%}")


def run_all(ns: argparse.Namespace, target: str, endpoint: str | None,
            pid: int | None) -> dict[str, Any]:
    show = True  # progress goes to stderr; --json keeps stdout for the report
    report: dict[str, Any] = {"target": target}
    if ns.baseline and endpoint:
        progress("baseline: raw etcd CAS and an empty gRPC call", show)
        report["baseline"] = {"cas": measure_cas(endpoint, ns.baseline_n, ns.concurrency, 3.0),
                              "empty_grpc": measure_empty_grpc(ns.baseline_n)}
    channel = grpc.insecure_channel(target)
    stub = pb_grpc.AgentTxServiceStub(channel)
    progress("one agent running workflows", show)
    report["workflows"] = workflows(stub, ns.workflows, 10, pid, show)
    report["replica_cpu_ms_per_step"] = step_cpu(stub, 300, pid)
    if ns.transactions:
        report["concurrent"] = concurrent(stub, ns.concurrency, ns.transactions, ns.tx_steps,
                                          show, target if ns.compare_workers else None)
    if ns.steps:
        report["long"] = long_transaction(stub, ns.steps, show)
    if ns.rss_transactions:
        report["rss"] = rss_over(stub, ns.rss_transactions, pid, show)
    channel.close()
    if ns.peers:
        from .peers import run_peers

        report["peers"] = run_peers(ns.peer_workflows or ns.workflows,
                                    lambda text: progress(text, show))
    report["ratios"] = ratios(report)
    return report


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="host:port of a running service (default: start one)")
    parser.add_argument("--etcd-endpoint", help="with --target: the etcd for the CAS baseline")
    parser.add_argument("--baseline", action="store_true",
                        help="also measure a raw etcd CAS and an empty gRPC call (ratios)")
    parser.add_argument("--baseline-n", type=int, default=2000)
    parser.add_argument("--workflows", type=int, default=200,
                        help="one agent: workflows of begin + 10 kv.put + commit")
    parser.add_argument("--transactions", type=int, default=200,
                        help="concurrent agents: transactions in all (0 = skip)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tx-steps", type=int, default=6, help="steps per concurrent transaction")
    parser.add_argument("--steps", type=int, default=0,
                        help="one transaction of N steps: p50 by step index (0 = skip)")
    parser.add_argument("--rss-transactions", type=int, default=0,
                        help="replica RSS across this many transactions (0 = skip)")
    parser.add_argument("--event-loop", choices=["asyncio", "uvloop"], default=None,
                        help="the started service's event loop (default: the service's)")
    parser.add_argument("--compare-workers", type=int, default=0, metavar="N",
                        help="also run the concurrent agents against a second service started "
                             "with --workers N on the same etcd, one connection per agent in "
                             "both runs, and report the ratio of steps/s (same run)")
    parser.add_argument("--peers", action="store_true",
                        help="also run the same workflow on LangGraph + PostgreSQL (durability "
                             "sync) and DBOS against a PostgreSQL started on loopback "
                             "(pip install 'agenttx[bench]'; Debian's postgresql)")
    parser.add_argument("--peer-workflows", type=int, default=0,
                        help="workflows per peer (default: --workflows)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON only")


def main(argv: list[str]) -> int:
    """`agenttx bench ARGV...` (the one `agenttx` parser)."""
    from agenttx.cli import main as agenttx_main

    return agenttx_main(["bench", *argv])


def run(ns: argparse.Namespace) -> int:
    if min(ns.workflows, ns.concurrency, ns.tx_steps) < 1:
        print("agenttx bench: --workflows, --concurrency and --tx-steps must be at least 1",
              file=sys.stderr)
        return 2
    if ns.target:
        report = run_all(ns, ns.target, ns.etcd_endpoint, None)
    else:
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(prefix="agenttx-bench-", dir=shm) as d:
            etcd = EmbeddedEtcd(pathlib.Path(d) / "etcd").start()
            port = free_port()
            env = dict(os.environ)
            if ns.event_loop:
                env["AGENTTX_EVENT_LOOP"] = ns.event_loop
            proc = _start_service(port, etcd.endpoints[0], d, env, "/agenttx")
            try:
                _wait_ready(f"127.0.0.1:{port}")
                report = run_all(ns, f"127.0.0.1:{port}", etcd.endpoints[0], proc.pid)
                report["etcd"] = "embedded 3.5.1, data on " + ("tmpfs" if shm else "disk")
                report["event_loop"] = ns.event_loop or "default"
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            try:
                if ns.compare_workers and ns.transactions:
                    report["workers"] = compare_workers(ns, etcd.endpoints[0], d, env, report)
            finally:
                etcd.stop()
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    errors = report.get("concurrent", {}).get("errors", 0) + \
        report.get("workers", {}).get("concurrent", {}).get("errors", 0)
    return 1 if errors else 0


def _start_service(port: int, endpoint: str, data_dir: str, env: dict[str, str], prefix: str,
                   workers: int = 1, metrics_port: int = 0) -> subprocess.Popen[bytes]:
    metrics = ["--metrics-listen", f"127.0.0.1:{metrics_port}"] if metrics_port else []
    return subprocess.Popen(
        [sys.executable, "-m", "agenttx", "serve", "--listen", f"127.0.0.1:{port}",
         "--etcd-endpoints", endpoint, "--etcd-prefix", prefix, "--data-dir", data_dir,
         "--log-level", "WARNING", "--max-open-transactions", "100000",
         "--workers", str(workers), *metrics],
        stderr=subprocess.DEVNULL, env=env)


def _wait_workers(metrics_port: int, workers: int, timeout: float = 120.0) -> None:
    """Until every worker serves (worker i answers /metrics on metrics_port + i once it
    started, just after its gRPC server did)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    pending = list(range(workers))
    while pending:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port + pending[0]}/metrics",
                                   timeout=2).read()
            pending.pop(0)
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {pending[0]} not serving after {timeout}s") from None
            time.sleep(0.1)


def compare_workers(ns: argparse.Namespace, endpoint: str, data_dir: str,
                    env: dict[str, str], report: dict[str, Any]) -> dict[str, Any]:
    """The concurrent agents against `agenttx serve --workers N` (its own key prefix, the
    same etcd), beside the one-process figure of this run: steps/s of each and the ratio.
    Both runs give every agent its own connection."""
    port = free_port()
    workers_dir = pathlib.Path(data_dir) / f"workers-{ns.compare_workers}"
    workers_dir.mkdir()
    metrics_port = free_port()
    proc = _start_service(port, endpoint, str(workers_dir), env, "/agenttx-workers",
                          ns.compare_workers, metrics_port)
    try:
        target = f"127.0.0.1:{port}"
        _wait_ready(target)
        _wait_workers(metrics_port, ns.compare_workers)
        with grpc.insecure_channel(target) as channel:
            many = concurrent(pb_grpc.AgentTxServiceStub(channel), ns.concurrency,
                              ns.transactions, ns.tx_steps, True, target)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    one = report["concurrent"]
    return {"workers": ns.compare_workers, "concurrent": many,
            "steps_per_s_1_worker": one["steps_per_s"],
            f"steps_per_s_{ns.compare_workers}_workers": many["steps_per_s"],
            "ratio": round(many["steps_per_s"] / one["steps_per_s"], 2)
            if one["steps_per_s"] else None}


def _wait_ready(target: str, timeout: float = 120.0) -> None:
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
