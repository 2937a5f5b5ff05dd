"""`agenttx bench toolsets`: what a toolset step costs beyond the MCP call it makes
(docs/toolsets.md, docs/benchmarks.md).

Two figures, each a ratio to baselines measured in the same run, moments apart, so a
busy machine moves both sides alike:

* **read**: a `read` toolset step's p50 minus the p50 of the same `tools/call` made
  directly (the official SDK's client, one warm session, like AgentTx's own) is what
  AgentTx adds to the call; divided by the floor, the step's own cost: a built-in read
  step (`kv.get`) measured in the same run. Target <= 1.25. The ratio to the gRPC + CAS
  floor of agenttx_bench.perf (`empty gRPC + raw etcd CAS`) is reported beside it, and
  so is the replica's CPU time per step of each kind (from /proc): the SDK client's own
  CPU is part of the direct call too, but runs in another process there.
* **deferred**: a `deferred` toolset step's p50 over an `effect.stage` step's p50 (both
  stage a call for after commit and reserve its idempotency key). Target <= 1.1.

Measurements are interleaved step by step (a direct call, then one step of each kind) in
one event loop, rather than run in blocks.
Everything runs here: an embedded etcd, an upstream MCP server (the SDK's, streamable
HTTP, in its own process) and one `agenttx serve --toolsets-file`. A user of the
service: it talks to it through the gRPC API only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import grpc

from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

from .perf import _wait_ready, cpu_seconds, measure_cas, measure_empty_grpc, summary

READ_TARGET, DEFERRED_TARGET = 1.25, 1.1

_UPSTREAM = '''
import sys, uvicorn
from pydantic import BaseModel
from mcp.server.mcpserver import MCPServer
class Hits(BaseModel):
    hits: list[str]
class Sent(BaseModel):
    queued: bool
server = MCPServer("bench-upstream", log_level="WARNING")
@server.tool()
async def search(query: str) -> Hits:
    """Find documents."""
    return Hits(hits=[query])
@server.tool()
async def send(to: str, subject: str) -> Sent:
    """Send a message."""
    return Sent(queued=True)
uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]),
            log_level="warning", access_log=False)
'''


def _listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"upstream on port {port} not listening after {timeout}s")


async def _measure(target: str, url: str, rounds: int, steps: int) -> dict[str, Any]:
    """Per round: one transaction per step kind; then, `steps` times, one direct call and
    one step of each kind in turn (interleaved, in one event loop, so load and loop
    overheads fall on every kind alike). Transactions are rolled back."""
    from mcp import Client

    key = f"bench-{uuid.uuid4().hex}"
    kinds = {
        "read": ("bench.search", lambda i: {"query": f"q{i}"}),
        "kv_get": ("kv.get", lambda i: {"key": key}),
        "deferred": ("bench.send", lambda i: {"to": "x@example.com", "subject": f"s{i}"}),
        "effect": ("effect.stage", lambda i: {"channel": "log", "payload": {"subject": f"s{i}"}}),
    }
    samples: dict[str, list[float]] = {k: [] for k in ("direct", *kinds)}
    async with grpc.aio.insecure_channel(target) as channel, \
            Client(url, cache=None) as direct:
        stub = pb_grpc.AgentTxServiceStub(channel)

        async def begin() -> str:
            resp = await stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="bench"))
            return str(resp.transaction_id)

        async def step(tx: str, n: int, tool: str, args: Any) -> float:
            req = pb.ExecuteStepRequest(transaction_id=tx, step_id=n, tool_name=tool,
                                        arguments_json=json.dumps(args))
            t0 = time.perf_counter()
            resp = await stub.ExecuteStep(req)
            elapsed = (time.perf_counter() - t0) * 1000
            if resp.status != pb.STEP_STATUS_SUCCESS:
                raise RuntimeError(f"{tool} failed: {resp.error_category}: {resp.clean_hint}")
            return elapsed

        async def call(n: int) -> float:
            t0 = time.perf_counter()
            result = await direct.call_tool("search", {"query": f"q{n}"})
            elapsed = (time.perf_counter() - t0) * 1000
            if result.is_error:
                raise RuntimeError("direct call failed")
            return elapsed

        setup = await begin()
        await step(setup, 1, "kv.put", {"key": key, "value": 1})
        await stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=setup))
        for r in range(rounds + 1):           # round 0 warms every path up, unrecorded
            txs = {name: await begin() for name in kinds}
            for n in range(1, steps + 1):
                took = {"direct": await call(n)}
                for name, (tool, args) in kinds.items():
                    took[name] = await step(txs[name], n, tool, args(n))
                if r:
                    for name, ms in took.items():
                        samples[name].append(ms)
            for tx in txs.values():
                await stub.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=tx))
    return {name: summary(values) for name, values in samples.items()}


async def _replica_cpu(target: str, pid: int, steps: int) -> dict[str, float | None]:
    """The replica's CPU time per step of each kind (blocks of `steps`, /proc)."""
    kinds = {"read": ("bench.search", {"query": "q"}), "kv_get": ("kv.get", {"key": "own"}),
             "deferred": ("bench.send", {"to": "x@example.com", "subject": "s"}),
             "effect": ("effect.stage", {"channel": "log", "payload": {}})}
    out: dict[str, float | None] = {}
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.AgentTxServiceStub(channel)
        for name, (tool, args) in kinds.items():
            tx = (await stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="cpu"))
                  ).transaction_id
            await stub.ExecuteStep(pb.ExecuteStepRequest(  # a key for kv.get to find
                transaction_id=tx, step_id=1, tool_name="kv.put",
                arguments_json=json.dumps({"key": "own", "value": 1})))
            before = cpu_seconds(pid)
            for n in range(2, steps + 2):
                await stub.ExecuteStep(pb.ExecuteStepRequest(
                    transaction_id=tx, step_id=n, tool_name=tool,
                    arguments_json=json.dumps(args)))
            after = cpu_seconds(pid)
            out[name] = None if before is None or after is None else \
                round((after - before) / steps * 1000, 2)
            await stub.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=tx))
    return out


def figures(report: dict[str, Any]) -> dict[str, Any]:
    lat = report["latency_ms"]
    base = report["baseline"]
    floor = base["cas"]["latency_ms"]["p50"] + base["empty_grpc"]["latency_ms"]["p50"]
    overhead = lat["read"]["p50"] - lat["direct"]["p50"]
    return {
        "step_floor_p50_ms": lat["kv_get"]["p50"],
        "grpc_cas_floor_p50_ms": round(floor, 3),
        "read_minus_direct_p50_ms": round(overhead, 3),
        "read_overhead_over_step_floor": round(overhead / lat["kv_get"]["p50"], 2),
        "read_overhead_over_grpc_cas_floor": round(overhead / floor, 2),
        "read_target": READ_TARGET,
        "deferred_over_effect_stage": round(lat["deferred"]["p50"] / lat["effect"]["p50"], 2),
        "deferred_target": DEFERRED_TARGET,
    }


def print_report(r: dict[str, Any]) -> None:
    lat, f = r["latency_ms"], r["figures"]
    for name, label in (("direct", "direct MCP tools/call"), ("read", "read toolset step"),
                        ("kv_get", "kv.get step"), ("deferred", "deferred toolset step"),
                        ("effect", "effect.stage step")):
        print(f"{label:<24} p50 {lat[name]['p50']:>7.3f} ms  p99 {lat[name]['p99']:>7.3f} ms")
    print(f"gRPC + CAS floor         p50 {f['grpc_cas_floor_p50_ms']:>7.3f} ms")
    print(f"read step - direct call  = {f['read_minus_direct_p50_ms']:.3f} ms = "
          f"{f['read_overhead_over_step_floor']}x the step floor (kv.get; target <= "
          f"{READ_TARGET}), {f['read_overhead_over_grpc_cas_floor']}x gRPC + CAS")
    cpu = r.get("replica_cpu_ms_per_step")
    if cpu:
        print("replica CPU per step     " + ", ".join(f"{k} {v} ms" for k, v in cpu.items()))
    print(f"deferred / effect.stage  = {f['deferred_over_effect_stage']}x "
          f"(target <= {DEFERRED_TARGET})")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=30,
                        help="rounds; each runs one transaction per kind")
    parser.add_argument("--steps", type=int, default=10, help="steps per transaction")
    parser.add_argument("--baseline-n", type=int, default=1000)
    parser.add_argument("--json", action="store_true", help="print the report as JSON only")


def run(ns: argparse.Namespace) -> int:
    if min(ns.rounds, ns.steps, ns.baseline_n) < 1:
        print("agenttx bench toolsets: --rounds, --steps and --baseline-n must be at least 1",
              file=sys.stderr)
        return 2
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="agenttx-bench-ts-", dir=shm) as d:
        etcd = EmbeddedEtcd(pathlib.Path(d) / "etcd").start()
        up_port, port = free_port(), free_port()
        url = f"http://127.0.0.1:{up_port}/mcp"
        upstream = subprocess.Popen([sys.executable, "-c", _UPSTREAM, str(up_port)],
                                    stderr=subprocess.DEVNULL)
        toolsets = pathlib.Path(d) / "toolsets.json"
        toolsets.write_text(json.dumps({"toolsets": [{"name": "bench", "spec": {
            "upstream": {"url": url}, "prefix": "bench",
            "tools": [{"name": "search", "kind": "read"},
                      {"name": "send", "kind": "deferred"}]}}]}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenttx", "serve", "--listen", f"127.0.0.1:{port}",
             "--etcd-endpoints", etcd.endpoints[0], "--data-dir", d, "--log-level", "WARNING",
             "--max-open-transactions", "100000", "--toolsets-file", str(toolsets)],
            stderr=subprocess.DEVNULL)
        try:
            _listening(up_port)
            _wait_ready(f"127.0.0.1:{port}")
            print("bench: baselines", file=sys.stderr, flush=True)
            report: dict[str, Any] = {"baseline": {
                "cas": measure_cas(etcd.endpoints[0], ns.baseline_n, 8, 2.0),
                "empty_grpc": measure_empty_grpc(ns.baseline_n)}}
            print("bench: toolset steps and direct calls", file=sys.stderr, flush=True)
            report["latency_ms"] = asyncio.run(_measure(f"127.0.0.1:{port}", url,
                                                        ns.rounds, ns.steps))
            report["replica_cpu_ms_per_step"] = asyncio.run(
                _replica_cpu(f"127.0.0.1:{port}", proc.pid, 200))
            report["figures"] = figures(report)
            report["rounds"], report["steps"] = ns.rounds, ns.steps
        finally:
            for p in (proc, upstream):
                p.terminate()
                p.wait(timeout=30)
            etcd.stop()
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


__all__ = ["configure", "figures", "run"]
