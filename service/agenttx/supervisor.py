"""`agenttx serve --workers N`: N replica processes on one port, so one host uses every core.

Why processes: a replica is one Python process whose step is CPU-bound on one core
(docs/benchmarks.md); replicas share nothing but etcd (docs/architecture.md), so N of
them on one host scale like N pods. Each worker is a full replica — its own replica id
(`<base>-w<i>`), liveness lease, leader elections, caches, background tasks — and they
all listen on the same address with `SO_REUSEPORT` (the kernel spreads connections over
them; a transaction's steps may land on any of them, which costs a read, never a wrong
answer).

What this module must never do:

* fork a process that holds gRPC or event-loop state (gRPC's core is not fork-safe):
  every worker is a fresh interpreter (`asyncio.create_subprocess_exec`, no
  `preexec_fn`), given the parent's settings as JSON on its stdin;
* share anything between workers but etcd: when no etcd endpoints are given, the parent
  starts the ONE embedded etcd (holding the data dir's lock) and hands its endpoints to
  every worker;
* let a worker that died go unnoticed: one that dies after it was serving is restarted
  under a NEW replica id (`<base>-w<i>.<n>`; the dead one's liveness key must be seen to
  expire, so others take over its half-done work: docs/recovery.md); one that cannot
  start stops the whole service with its exit code, as a single replica would.

SIGTERM/SIGINT to the parent is forwarded to every worker, which drains its in-flight
RPCs (`--grace-period-s`); the parent waits for them, then stops the embedded etcd.

Metrics: each worker serves its own /metrics on `--metrics-listen`'s port + i
(docs/operations.md, "Metrics with --workers").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .config import Settings

log = logging.getLogger(__name__)

# A worker restarted this soon after its previous start counts as crash-looping: after
# MAX_QUICK_RESTARTS in a row the service stops (non-zero) instead of spinning.
QUICK_RESTART_S = 30.0
MAX_QUICK_RESTARTS = 5
# What a worker writes on its stdout once it serves (the parent's readiness signal).
READY_LINE = b"agenttx-worker-ready\n"


def worker_settings(settings: Settings, index: int, generation: int,
                    endpoints: list[str], base_id: str) -> Settings:
    """The settings of worker `index`: the parent's, one process, its own replica id and
    metrics port, and the etcd every worker shares."""
    replica_id = f"{base_id}-w{index}" + (f".{generation}" if generation else "")
    metrics = settings.metrics_listen
    if metrics:
        host, _, port = metrics.rpartition(":")
        metrics = f"{host}:{int(port) + index}"
    return settings.model_copy(update={
        "workers": 1, "replica_id": replica_id, "metrics_listen": metrics,
        "etcd_endpoints": ",".join(endpoints)})


@dataclass
class _Worker:
    index: int
    generation: int = 0
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    ready: bool = False
    quick_restarts: int = 0
    replica_id: str = ""
    waiter: asyncio.Task[int] | None = field(default=None, repr=False)


class Supervisor:
    """Runs `settings.workers` workers until a signal, then drains them."""

    def __init__(self, settings: Settings, endpoints: list[str], stopping: asyncio.Event
                 ) -> None:
        self.settings = settings
        self.endpoints = endpoints
        self.base_id = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.workers = [_Worker(i) for i in range(settings.workers)]
        self.stopping = stopping

    async def _spawn(self, w: _Worker) -> None:
        settings = worker_settings(self.settings, w.index, w.generation, self.endpoints,
                                   self.base_id)
        w.replica_id = settings.replica_id or ""
        w.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agenttx.supervisor",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert w.proc.stdin is not None
        w.proc.stdin.write(settings.model_dump_json().encode())
        await w.proc.stdin.drain()
        w.proc.stdin.close()
        w.started, w.ready = time.monotonic(), False
        log.info("worker started", extra={"worker": w.index, "pid": w.proc.pid,
                                          "replica": w.replica_id})

    async def _watch(self, w: _Worker) -> int:
        """Until the worker exits: note when it is ready; its exit code."""
        proc = w.proc
        assert proc is not None and proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            if line == READY_LINE:
                w.ready = True
        return await proc.wait()

    async def run(self) -> int:
        for w in self.workers:
            await self._spawn(w)
            w.waiter = asyncio.ensure_future(self._watch(w))
        stop = asyncio.ensure_future(self.stopping.wait())
        code = 0
        try:
            while not self.stopping.is_set():
                waiters = {w.waiter for w in self.workers if w.waiter is not None}
                done, _ = await asyncio.wait({stop, *waiters}, return_when=asyncio.FIRST_COMPLETED)
                for w in self.workers:
                    if w.waiter is None or w.waiter not in done:
                        continue
                    rc = w.waiter.result()
                    if self.stopping.is_set():
                        continue
                    if not w.ready:
                        log.error("worker could not start; stopping the service",
                                  extra={"worker": w.index, "replica": w.replica_id,
                                         "exit_code": rc})
                        code = rc or 1
                        self.stopping.set()
                        continue
                    quick = time.monotonic() - w.started < QUICK_RESTART_S
                    w.quick_restarts = w.quick_restarts + 1 if quick else 0
                    if w.quick_restarts > MAX_QUICK_RESTARTS:
                        log.error("worker keeps dying; stopping the service",
                                  extra={"worker": w.index, "exit_code": rc})
                        code = rc or 1
                        self.stopping.set()
                        continue
                    log.error("worker died; restarting it under a new replica id",
                              extra={"worker": w.index, "replica": w.replica_id,
                                     "exit_code": rc})
                    w.generation += 1
                    await self._spawn(w)
                    w.waiter = asyncio.ensure_future(self._watch(w))
        finally:
            stop.cancel()
            await self._drain()
        return code

    async def _drain(self) -> None:
        """SIGTERM every worker (each drains its RPCs), wait; kill what outlives the grace."""
        live = [w for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for w in live:
            assert w.proc is not None
            w.proc.send_signal(signal.SIGTERM)
        deadline = self.settings.grace_period_s + 15.0
        waiters = [w.waiter for w in self.workers if w.waiter is not None]
        if not waiters:
            return
        _, pending = await asyncio.wait(waiters, timeout=deadline)
        for w in self.workers:
            if w.waiter in pending and w.proc is not None:
                log.error("worker did not stop in time; killing it", extra={"worker": w.index})
                w.proc.kill()
        if pending:
            await asyncio.wait(pending, timeout=10.0)
        log.info("workers stopped")


async def supervise(settings: Settings) -> int:
    """Run the workers of `settings` (the parent of `agenttx serve --workers N`). Starts
    the embedded etcd here, once, when no endpoints are given; a signal during its
    start-up stops it too (as for a single replica: server.serve)."""
    from .embedded_etcd import DataDirLock, EmbeddedEtcd
    from .server import ETCD_START_TIMEOUT_S, _start_etcd

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        endpoints = settings.endpoints()
        if endpoints:
            return await Supervisor(settings, endpoints, stopping).run()
        data_dir = pathlib.Path(settings.data_dir)
        lock = DataDirLock(data_dir, {"listen": settings.listen}).acquire()
        embedded = EmbeddedEtcd(data_dir / "etcd", max_txn_ops=settings.etcd_max_txn_ops,
                                max_request_bytes=settings.etcd_max_request_bytes)
        try:
            if not await _start_etcd(embedded, stopping, ETCD_START_TIMEOUT_S):
                return 0
            log.info("started embedded etcd for the workers (development only; use "
                     "--etcd-endpoints in production)", extra={"endpoints": embedded.endpoints})
            return await Supervisor(settings, embedded.endpoints, stopping).run()
        finally:
            embedded.stop()  # after every worker stopped: Supervisor.run drains them first
            lock.release()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def loop_factory(name: str) -> Any:
    """uvloop when asked for and installed (measured faster: docs/benchmarks.md),
    else asyncio's own loop."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            return None
        return uvloop.new_event_loop
    return None


def _worker_main() -> int:
    """A worker: settings as JSON on stdin (never flags or the environment, so it runs
    exactly what its parent was given), then one replica until SIGTERM."""
    from . import logs
    from .server import serve

    settings = Settings(**json.loads(sys.stdin.buffer.read()))
    logs.setup(settings.log_format, settings.log_level)

    async def run() -> int:
        ready = asyncio.Event()

        async def announce() -> None:
            await ready.wait()
            os.write(sys.stdout.fileno(), READY_LINE)

        task = asyncio.ensure_future(announce())
        try:
            return await serve(settings, ready=ready, reuse_port=True)
        finally:
            task.cancel()

    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        return runner.run(run())


if __name__ == "__main__":
    sys.exit(_worker_main())
