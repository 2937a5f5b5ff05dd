"""A replica keeps answering while it parses and resolves a 1 MiB argument document
(docs/architecture.md, "The event loop is never held").

The rule: a step's argument parsing and reference resolution never hold the replica's
event loop for more than 50 ms. What a user notices when it is broken is every other call
waiting, health checks first (issue 17: 0.53 s behind one such step). So this measures
grpc.health.v1 Check, called back to back from a thread, on the idle replica and while it
executes a step whose 1 MiB of arguments holds 65,000 `${steps.1.value}` references. The
step's output is small, so what it measures is the parsing and the resolution.

The bound: 50 ms of blocking plus the health call's own p99 on the idle replica (its
round trip on this machine, measured in the same test), times SLACK for a busy machine.
Before the arguments moved off the loop, the worst call waited out the whole step.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from support.service import Agent, ServiceProcess
from support.waiting import SLACK, eventually, slack

MIB = 1024 * 1024
BLOCK_S = 0.050  # the rule: the loop is never held longer than this


class HealthProbe:
    """grpc.health.v1 Check in a loop on its own channel: (start, latency) of each call."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = health_pb2_grpc.HealthStub(self.channel)

    def call(self) -> tuple[float, float]:
        start = time.monotonic()
        reply = self.stub.Check(health_pb2.HealthCheckRequest(), timeout=slack(5))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        return start, time.monotonic() - start

    def calls(self, n: int) -> list[float]:
        return [self.call()[1] for _ in range(n)]

    @contextmanager
    def running(self) -> Iterator[list[tuple[float, float]]]:
        samples: list[tuple[float, float]] = []
        done = threading.Event()

        def loop() -> None:
            while not done.is_set():
                samples.append(self.call())

        thread = threading.Thread(target=loop, name="health-probe")
        thread.start()
        try:
            yield samples
        finally:
            done.set()
            thread.join(timeout=slack(5))


@pytest.mark.timeout(300)
def test_health_answers_while_a_replica_resolves_a_mebibyte_of_references(
        etcd, scratch: pathlib.Path) -> None:
    svc = ServiceProcess("loop-free", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-loop-{uuid.uuid4().hex[:8]}",
                         workdir=scratch / "loop-free").start()
    probe = HealthProbe(svc.address)
    try:
        probe.calls(20)  # warm the channel
        idle = sorted(probe.calls(300))
        idle_p99 = idle[int(len(idle) * 0.99)]
        bound = SLACK * (BLOCK_S + idle_p99)

        agent = Agent(svc.stub)
        agent.ok("kv.put", {"key": "part", "value": "ab"})
        count = (MIB - 64) // len("${steps.1.value}")
        document = json.dumps({"key": "joined", "value": "${steps.1.value}" * count})
        assert MIB - 64 < len(document) <= MIB
        with probe.running() as samples:
            eventually(lambda: samples, slack(5), "the probe has its first answer")
            started = time.monotonic()
            output = agent.ok("kv.put", raw=document)
            ended = time.monotonic()
        assert output == {"key": "joined", "value": "ab" * count}

        during = [latency for start, latency in samples
                  if start <= ended and start + latency >= started]
        assert len(during) >= 3, (len(during), ended - started)
        worst = max(during)
        assert worst <= bound, (
            f"a health check waited {worst * 1000:.0f} ms while the step ran "
            f"({ended - started:.2f} s, {len(during)} checks); the bound is "
            f"{bound * 1000:.0f} ms = {SLACK:g} x (50 ms + idle p99 {idle_p99 * 1000:.1f} ms)")
    finally:
        probe.channel.close()
        svc.stop()
