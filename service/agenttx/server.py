"""One service replica: etcd connection, policy watch, liveness lease, gRPC server.

Lifecycle: start an embedded etcd when no endpoints are configured; connect; register
this replica under a lease (so others can tell a crashed owner from a slow one); start
watching policies; serve gRPC with health. On SIGTERM: report NOT_SERVING, let
in-flight RPCs finish (grace period), stop background work, stop embedded etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import signal
import socket
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .api.servicer import AgentTxServicer, add_to_server
from .auth import Authenticator, RateLimiter, check_listen_allowed, server_credentials_from_settings
from .config import Settings
from .contracts.layout import Keys
from .effects.channels import ChannelRegistry
from .effects.deadletters import DeadLetters
from .effects.outbox import Dispatcher
from .embedded_etcd import EmbeddedEtcd
from .engine.engine import Engine
from .engine.limits import RESPONSE_BYTES
from .engine.policy import RollbackSettings
from .observability import tracing
from .observability.metrics import METRICS
from .store.client import Store, connect
from .tools.registry import ToolRegistry
from .workers.policies import PolicyCache
from .workers.reaper import Reaper

log = logging.getLogger(__name__)

SERVICE_NAME = "agenttx.v1.AgentTxService"
# Requests carry up to 1 MiB of arguments and 1 MiB of raw_context (SPEC §1); responses
# are kept within gRPC's default client limit by the engine's budgets (engine.limits).
MAX_RECEIVE_BYTES = RESPONSE_BYTES
MAX_SEND_BYTES = RESPONSE_BYTES


class ReadinessProbe:
    """Health answers NOT_SERVING while this replica cannot reach etcd (SPEC §10), and
    SERVING again once it can: a partitioned replica is taken out of the Service by its
    readiness probe instead of failing every call. Checked every `interval_s`; two
    failures in a row flip it (within ~2 intervals + the timeout of losing etcd)."""

    def __init__(self, store: Store, health: health.aio.HealthServicer, *,
                 interval_s: float = 2.0, timeout_s: float = 2.0) -> None:
        self.store, self.health = store, health
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.serving: bool | None = None
        self._task: asyncio.Task[None] | None = None
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
        self._task = asyncio.create_task(self._loop(), name="readiness")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class ReplicaPresence:
    """`<prefix>/replicas/<id>` on a lease, refreshed in the background."""

    def __init__(self, store: Store, keys: Keys, replica_id: str, ttl_s: int = 10) -> None:
        self.store, self.keys, self.replica_id = store, keys, replica_id
        self.ttl_s = ttl_s
        self._task: asyncio.Task[None] | None = None
        self.lease_id = 0

    async def _register(self) -> None:
        lease = await self.store.client.lease(self.ttl_s)
        self.lease_id = lease.id
        await self.store.put(self.keys.replica(self.replica_id), b"alive", lease=lease.id,
                             what="replica presence")

    async def _loop(self) -> None:
        while True:
            try:
                if not self.lease_id:
                    await self._register()
                await asyncio.sleep(self.ttl_s / 3)
                resp = await self.store.client.refresh_lease(self.lease_id)
                if getattr(resp, "TTL", 1) <= 0:
                    self.lease_id = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("replica lease refresh failed", extra={"error": str(exc)})
                self.lease_id = 0
                await asyncio.sleep(1.0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="replica-presence")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.lease_id:
            with contextlib.suppress(Exception):
                await self.store.client.revoke_lease(self.lease_id)


async def serve(settings: Settings, *, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None) -> int:
    """Run one replica until SIGTERM/SIGINT (or until `stop` is set, when given: how a
    test runs a replica in its own event loop)."""
    check_listen_allowed(settings.listen, settings.auth, settings.allow_unauthenticated)
    tracing.setup()  # off unless the OTEL_* environment configures an exporter
    embedded: EmbeddedEtcd | None = None
    endpoints = settings.endpoints()
    data_dir = pathlib.Path(settings.data_dir)
    if not endpoints:
        embedded = EmbeddedEtcd(data_dir / "etcd", max_txn_ops=settings.etcd_max_txn_ops,
                                max_request_bytes=settings.etcd_max_request_bytes)
        await asyncio.to_thread(embedded.start)
        endpoints = embedded.endpoints
        log.info("started embedded etcd (development only; use --etcd-endpoints in production)",
                 extra={"endpoints": endpoints, "data_dir": str(data_dir / "etcd")})
    try:
        return await _serve_on(settings, endpoints, data_dir, ready, stop)
    finally:
        # also when start-up fails (bad settings): never leave an embedded etcd behind
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
            log.info("stopped")


async def _serve_on(settings: Settings, endpoints: list[str], data_dir: pathlib.Path,
                    ready: asyncio.Event | None, stop: asyncio.Event | None) -> int:
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
    dispatcher = Dispatcher(store, keys.prefix, channels, replica_id,
                            lease_ttl_s=settings.leader_ttl_s,
                            poll_interval_s=settings.effect_poll_s,
                            claim_s=settings.effect_claim_s)
    engine = Engine(store=store, keys=keys, tools=ToolRegistry.load(),
                    resolve_policy=policies.resolve, default_fs_root=fs_root,
                    replica_id=replica_id, channel_names=channels.names,
                    max_txn_ops=settings.etcd_max_txn_ops,
                    max_request_bytes=settings.etcd_max_request_bytes, dispatcher=dispatcher,
                    max_open_transactions=settings.max_open_transactions,
                    effect_key_retention_s=settings.effect_key_retention_s,
                    history_retention_s=settings.history_retention_s,
                    service_namespace=settings.service_namespace)
    METRICS.zero_initialise(engine.tools.names(), channels.names())

    presence = ReplicaPresence(store, keys, replica_id, settings.replica_ttl_s)
    try:
        await policies.load()
        await presence._register()
    except Exception as exc:
        log.warning("etcd not reachable at start-up; serving and retrying in the background",
                    extra={"error": str(exc)})
    policies.start()
    presence.start()
    reaper = Reaper(engine, store, keys, replica_id, settings.tx_idle_timeout_s,
                    ttl_s=settings.leader_ttl_s,
                    fs_roots=lambda: [fs_root, *policies.sandbox_roots()],
                    temp_sweep_s=settings.temp_sweep_s, temp_min_age_s=settings.temp_min_age_s)
    background = [asyncio.create_task(dispatcher.run(), name="dispatcher"),
                  asyncio.create_task(reaper.run(), name="reaper"),
                  asyncio.create_task(engine.committer.retention.keep_fresh(),
                                      name="retention-lease"),
                  asyncio.create_task(engine.history_lease.keep_fresh(),
                                      name="history-lease")]

    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
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
    await server.start()
    readiness.start()
    metrics_server = _start_metrics(settings.metrics_listen)
    log.info("agenttx serving", extra={"listen": settings.listen, "port": port,
                                        "auth": authenticator.mode.value,
                                        "tls": credentials is not None,
                                        "replica": replica_id, "etcd": endpoints,
                                        "prefix": keys.prefix, "fs_root": fs_root})
    if ready is not None:
        ready.set()

    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, _dump_tasks if sig == signal.SIGUSR1 else stop.set)
    await stop.wait()
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(sig)

    log.info("shutting down: draining in-flight RPCs", extra={"grace_s": settings.grace_period_s})
    await readiness.stop()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(settings.grace_period_s)
    for task in background:
        task.cancel()
    for task in background:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await channels.aclose()  # the webhook channels' pooled connections
    await policies.stop()
    await presence.stop()
    await authenticator.stop()
    tracing.shutdown()
    if metrics_server is not None:
        metrics_server.shutdown()
    await store.close()
    log.info("stopped")
    return 0


def _add_reflection(server: grpc.aio.Server) -> None:
    """gRPC server reflection (SPEC §10): `grpcurl list` shows the service and health."""
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
