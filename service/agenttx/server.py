"""One service replica: etcd connection, policy watch, liveness lease, gRPC server.

Lifecycle: handle SIGTERM/SIGINT; when no endpoints are configured, lock the data dir and
start an embedded etcd under it; connect; register this replica under a lease (so others
can tell a crashed owner from a slow one); start watching policies; serve gRPC with
health. On SIGTERM: report NOT_SERVING, let in-flight RPCs finish (grace period), stop
background work, stop the embedded etcd, release the data dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pathlib
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from . import failpoints
from .api.servicer import AgentTxServicer, add_to_server
from .auth import Authenticator, RateLimiter, check_listen_allowed, server_credentials_from_settings
from .config import Settings
from .contracts.layout import Keys
from .effects.channels import ChannelRegistry
from .effects.deadletters import DeadLetters
from .effects.deferred import deferred_delivery
from .effects.outbox import Dispatcher
from .embedded_etcd import DataDirLock, EmbeddedEtcd, StartAborted
from .engine.engine import Engine
from .engine.limits import RESPONSE_BYTES
from .engine.policy import RollbackSettings
from .observability import tracing
from .observability.metrics import METRICS
from .store.client import Store, connect
from .store.lease import LeaseKeeper
from .tasks import BackgroundTasks
from .tools.registry import ToolRegistry
from .tools.toolsets import Toolsets
from .workers.policies import PolicyCache
from .workers.reaper import Reaper
from .workers.toolsets import ToolsetSources

log = logging.getLogger(__name__)

SERVICE_NAME = "agenttx.v1.AgentTxService"
# Requests carry up to 1 MiB of arguments and 1 MiB of raw_context (docs/api.md#status-codes); responses
# are kept within gRPC's default client limit by the engine's budgets (engine.limits).
MAX_RECEIVE_BYTES = RESPONSE_BYTES
MAX_SEND_BYTES = RESPONSE_BYTES
# A full garbage collection after this many collections of the middle generation
# (CPython's default: 10); see _tune_garbage_collection.
FULL_COLLECTION_EVERY = 100
# How long the embedded etcd may take to answer its health check (usually under a second;
# a busy laptop can take several).
ETCD_START_TIMEOUT_S = 30.0


class ReadinessProbe:
    """Health answers NOT_SERVING while this replica cannot reach etcd
    (docs/operations.md#health-readiness-and-liveness), and SERVING again once it can: a
    partitioned replica is taken out of the Service by its readiness probe instead of failing
    every call. Checked every `interval_s`; two failures in a row flip it (within ~2 intervals
    + the timeout of losing etcd)."""

    def __init__(self, store: Store, health: health.aio.HealthServicer, *,
                 interval_s: float = 2.0, timeout_s: float = 2.0) -> None:
        self.store, self.health = store, health
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.serving: bool | None = None
        self._tasks = BackgroundTasks("readiness")
        self._failures = 0

    async def _set(self, serving: bool) -> None:
        if self.serving is serving:
            return
        self.serving = serving
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)
        log.log(logging.INFO if serving else logging.WARNING,
                "readiness changed", extra={"serving": serving})

    async def check(self) -> bool:
        try:
            await self.store.ping(self.timeout_s)
        except Exception:
            self._failures += 1
            if self._failures >= 2 or self.serving is None:
                await self._set(False)
            return False
        self._failures = 0
        await self._set(True)
        return True

    async def _loop(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._tasks.start(self._loop(), name="readiness")

    async def stop(self) -> None:
        await self._tasks.stop()


def replica_presence(store: Store, keys: Keys, replica_id: str, ttl_s: int = 10) -> LeaseKeeper:
    """`<prefix>/replicas/<id>` on a lease kept alive (and re-granted after an outage):
    how other replicas tell a crashed owner of an in-flight step from a slow one."""
    key = keys.replica(replica_id)

    async def attach(lease_id: int) -> bool:
        await store.put(key, b"alive", lease=lease_id, what="replica presence")
        return True

    return LeaseKeeper(store, ttl_s, what="replica presence", attach=attach, regrant=True)


async def serve(settings: Settings, *, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None, data_dir_lock: DataDirLock | None = None,
                reuse_port: bool = False) -> int:
    """Run one replica until SIGTERM/SIGINT (or until `stop` is set, when given: how a
    test runs a replica in its own event loop).

    SIGTERM and SIGINT are handled from the first moment, so one that arrives while the
    embedded etcd is still coming up stops that etcd too (docs/architecture.md, "The
    embedded etcd"). Without etcd endpoints the data dir is locked first (or
    `data_dir_lock`, already held, is used and released at the end). Raises
    EmbeddedEtcdError, one line for a person, when the embedded etcd cannot run (its data
    dir is held by another service, an etcd left behind cannot be stopped, or it does
    not start). `reuse_port`: one of `--workers N` sharing the address (agenttx.supervisor)."""
    check_listen_allowed(settings.listen, settings.auth, settings.allow_unauthenticated)
    failpoints.arm(settings.failpoints)
    tracing.setup()  # off unless the OTEL_* environment configures an exporter
    stop = stop if stop is not None else asyncio.Event()
    data_dir = pathlib.Path(settings.data_dir)
    with _stop_on_signals(stop):
        endpoints = settings.endpoints()
        if endpoints:
            return await _serve_on(settings, endpoints, data_dir, ready, stop, reuse_port)
        lock = data_dir_lock or DataDirLock(data_dir, {"listen": settings.listen}).acquire()
        try:
            return await _serve_embedded(settings, data_dir, ready, stop, lock)
        finally:
            lock.release()


async def _serve_embedded(settings: Settings, data_dir: pathlib.Path,
                          ready: asyncio.Event | None, stop: asyncio.Event,
                          lock: DataDirLock) -> int:
    """Serve on an etcd of our own under `data_dir`, which this process holds (`lock`)
    for as long as that etcd may run: no other service can start one on the same files,
    and no path out of here (a start-up error, a signal during start-up, a normal stop)
    leaves the etcd running. Only SIGKILL can; the next start stops that survivor."""
    embedded = EmbeddedEtcd(data_dir / "etcd", max_txn_ops=settings.etcd_max_txn_ops,
                            max_request_bytes=settings.etcd_max_request_bytes)
    lock.note(listen=settings.listen, etcd=",".join(m.client_url for m in embedded.members))
    try:
        if not await _start_etcd(embedded, stop, ETCD_START_TIMEOUT_S):
            log.info("stopped while starting")
            return 0
        log.info("started embedded etcd (development only; use --etcd-endpoints in "
                 "production)", extra={"endpoints": embedded.endpoints,
                                       "data_dir": str(embedded.base)})
        return await _serve_on(settings, embedded.endpoints, data_dir, ready, stop)
    finally:
        # synchronous on purpose: a second signal or a cancellation cannot cut it short
        embedded.stop()


async def _start_etcd(embedded: EmbeddedEtcd, stop: asyncio.Event, timeout: float) -> bool:
    """Start the etcd (on a thread: it polls until healthy); False when `stop` was set
    first, in which case start() has stopped the etcd before this returns."""
    abort = threading.Event()
    starting = asyncio.ensure_future(asyncio.to_thread(embedded.start, timeout, abort=abort))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not starting.done():
        abort.set()
    try:
        await starting
    except StartAborted:
        return False
    return True


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set `stop` (drain, then exit); SIGUSR1 logs every task's stack."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, _dump_tasks if sig == signal.SIGUSR1 else stop.set)
    try:
        yield
    finally:
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)


async def _serve_on(settings: Settings, endpoints: list[str], data_dir: pathlib.Path,
                    ready: asyncio.Event | None, stop: asyncio.Event,
                    reuse_port: bool = False) -> int:
    store = connect(endpoints, timeout=settings.etcd_timeout_s, ca_file=settings.etcd_ca_file,
                    cert_file=settings.etcd_cert_file, key_file=settings.etcd_key_file,
                    tls_server_name=settings.etcd_tls_server_name)
    authenticator = Authenticator.from_settings(settings, store=store)
    credentials = server_credentials_from_settings(settings)
    keys = Keys(settings.etcd_prefix)
    replica_id = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}"
    fs_root = settings.fs_root or str(data_dir / "sandbox")
    pathlib.Path(fs_root).mkdir(parents=True, exist_ok=True)

    default = settings.default_policy
    policies = PolicyCache(store, keys, RollbackSettings(
        default.max_local_depth, default.max_global_resets, default.replay_budget_factor),
        settings.tx_idle_timeout_s, settings.service_namespace,
        default_approval=default.approval_settings())
    channels = ChannelRegistry.from_config(settings.effect_channels)
    toolsets = Toolsets(service_namespace=settings.service_namespace,
                        max_connections=settings.toolset_max_connections)
    tools = ToolRegistry.load()
    tools.attach(toolsets)
    dispatcher = Dispatcher(store, keys.prefix, channels, replica_id,
                            lease_ttl_s=settings.leader_ttl_s,
                            poll_interval_s=settings.effect_poll_s,
                            claim_s=settings.effect_claim_s,
                            deferred=deferred_delivery(toolsets))
    engine = Engine(store=store, keys=keys, tools=tools,
                    resolve_policy=policies.resolve, default_fs_root=fs_root,
                    replica_id=replica_id, channel_names=channels.names,
                    max_txn_ops=settings.etcd_max_txn_ops,
                    max_request_bytes=settings.etcd_max_request_bytes, dispatcher=dispatcher,
                    max_open_transactions=settings.max_open_transactions,
                    effect_key_retention_s=settings.effect_key_retention_s,
                    history_retention_s=settings.history_retention_s,
                    service_namespace=settings.service_namespace)
    METRICS.zero_initialise(engine.tools.names(), channels.names())

    presence = replica_presence(store, keys, replica_id, settings.replica_ttl_s)
    toolset_sources = ToolsetSources(store, keys, toolsets, file=settings.toolsets_file,
                                     refresh_s=settings.toolsets_refresh_s)
    try:
        await policies.load()
        await presence.acquire()
        await toolset_sources.load()
    except Exception as exc:
        log.warning("etcd not reachable at start-up; serving and retrying in the background",
                    extra={"error": str(exc)})
    await toolset_sources.start()
    policies.start()
    presence.start()
    reaper = Reaper(engine, store, keys, replica_id, settings.tx_idle_timeout_s,
                    ttl_s=settings.leader_ttl_s,
                    fs_roots=lambda: [fs_root, *policies.sandbox_roots()],
                    temp_sweep_s=settings.temp_sweep_s, temp_min_age_s=settings.temp_min_age_s)
    background = BackgroundTasks("replica")
    background.start(dispatcher.run(), name="dispatcher")
    background.start(reaper.run(), name="reaper")
    background.start(engine.committer.retention.keep_fresh(), name="retention-lease")
    background.start(engine.history_lease.keep_fresh(), name="history-lease")

    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        # --workers N: every worker binds the same address and the kernel spreads the
        # connections. Said explicitly, not left to gRPC's default (on for Linux only).
        *([("grpc.so_reuseport", 1)] if reuse_port else []),
    ])
    dead_letters = DeadLetters(store, keys, engine.committer.retention.lease_id)
    add_to_server(AgentTxServicer(engine, authenticator, RateLimiter(settings.max_requests_per_s),
                                  settings.admins(), dead_letters=dead_letters), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    _add_reflection(server)
    port = (server.add_secure_port(settings.listen, credentials) if credentials is not None
            else server.add_insecure_port(settings.listen))
    if port == 0:
        raise SystemExit(f"cannot listen on {settings.listen}")
    await authenticator.start()
    readiness = ReadinessProbe(store, health_servicer)
    await readiness.check()
    _tune_garbage_collection()  # start-up is done: what exists now lives as long as we do
    await server.start()
    readiness.start()
    metrics_server = _start_metrics(settings.metrics_listen)
    log.info("agenttx serving", extra={"listen": settings.listen, "port": port,
                                        "auth": authenticator.mode.value,
                                        "tls": credentials is not None,
                                        "replica": replica_id, "pid": os.getpid(),
                                        "etcd": endpoints,
                                        "prefix": keys.prefix, "fs_root": fs_root})
    if ready is not None:
        ready.set()
    await stop.wait()

    log.info("shutting down: draining in-flight RPCs", extra={"grace_s": settings.grace_period_s})
    await readiness.stop()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(settings.grace_period_s)
    await background.stop()
    await channels.aclose()  # the webhook channels' pooled connections
    await policies.stop()
    await toolset_sources.stop()
    await presence.stop()
    await authenticator.stop()
    tracing.shutdown()
    if metrics_server is not None:
        metrics_server.shutdown()
    await store.close()
    log.info("stopped", extra={"replica": replica_id})
    return 0


def _tune_garbage_collection() -> None:
    """Keep full garbage collections rare and short: each walks every tracked object
    while holding the GIL, stalling the whole replica (docs/architecture.md, "The event
    loop is never held").

    - What start-up built (modules, classes, schemas: ~100k objects) lives as long as the
      process: frozen after one collection, it is never walked again. A full collection
      over it took 160-200 ms on a busy 2-core machine.
    - With that heap frozen, CPython's brake on full collections (wait until the old
      generation grew by a quarter) no longer holds them back: while a 1 MiB argument
      document's tens of thousands of objects were alive, one ran every ~70,000
      allocations, each walking them all (30-50 ms). One full collection per 100, not
      10, collections of the middle generation: none during such a step, and cycles that
      survive the young generations are still collected, later.

    Process-wide, like the signal handlers: a test that runs `serve()` in its own process
    keeps these settings after it returns."""
    gc.collect()
    gc.freeze()
    young, middle, _old = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


def _add_reflection(server: grpc.aio.Server) -> None:
    """gRPC server reflection (docs/operations.md#grpc-reflection): `grpcurl list` shows the
    service and health."""
    from grpc_reflection.v1alpha import reflection

    from agenttx.v1 import agenttx_pb2

    names = (agenttx_pb2.DESCRIPTOR.services_by_name["AgentTxService"].full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)


def _start_metrics(listen: str) -> Any:
    """Prometheus /metrics on `listen` (host:port) in a background thread, or None."""
    if not listen:
        return None
    from prometheus_client import start_http_server

    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0",
                                        registry=METRICS.registry)
    log.info("metrics serving", extra={"listen": listen})
    return server


def _dump_tasks() -> None:
    """SIGUSR1: log where every asyncio task is waiting (for diagnosing a stuck call)."""
    for task in asyncio.all_tasks():
        frames = [f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}"
                  for f in task.get_stack(limit=20)]
        log.warning("task stack", extra={"task": task.get_name(), "stack": frames})
