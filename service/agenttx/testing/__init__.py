"""Run a real AgentTx service for a test: a real etcd and real `agenttx serve` processes.

Why: tests of an agent, of a custom tool package or of AgentTx itself must talk to the
service users run, never to an in-process fake. This module starts and stops exactly
that (etcd from `agenttx.embedded_etcd`, `python -m agenttx serve` as a child process),
waits until it answers its gRPC health check, and cleans up after itself.

    from agenttx.testing import serve

    def test_my_agent():
        with serve() as svc:                       # etcd + one replica, temp dirs
            with svc.client() as client, client.transaction() as tx:
                assert tx.step("kv.put", {"key": "a", "value": 1}).ok
            assert (svc.fs_root / "...").exists()  # the sandbox of fs.* tools

Tool plug-ins installed in the running interpreter's environment (`agenttx.tools` entry
points) are loaded by the service, so a custom tool package is tested as deployed. For
pytest fixtures (`agenttx_service`, `agenttx_client`) enable the plugin:
`pytest_plugins = ["agenttx.testing.pytest_plugin"]` in your conftest.py.

What it must never do: share state between two `serve()` calls (each gets its own etcd,
or its own key prefix when you pass `etcd_endpoints`), leave a process running after the
`with` block, or spawn with `preexec_fn` (gRPC and fork do not mix; children are started
with `start_new_session` only).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

from ..client import TLS, AsyncClient, Client
from ..embedded_etcd import EmbeddedEtcd, free_port

__all__ = ["Service", "ServiceProcess", "free_port", "scratch_dir", "serve"]


def scratch_dir(prefix: str = "agenttx-test-") -> pathlib.Path:
    """A fresh temporary directory, on /dev/shm when it exists (fast fsync for etcd)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class ServiceProcess:
    """One `agenttx serve` replica as a child process, its log captured to a file.

    `etcd_endpoints` None lets the service start its own embedded etcd under its data
    dir (what `agenttx serve` does without `--etcd-endpoints`). `env` is added to this
    process's environment, `extra_args` to the command line (any `agenttx serve` flag).
    The replica logs JSON; `logs()` returns its records.
    """

    def __init__(self, name: str = "agenttx", *, etcd_endpoints: Sequence[str] | None = None,
                 prefix: str = "/agenttx", fs_root: str | os.PathLike[str] | None = None,
                 workdir: str | os.PathLike[str], env: Mapping[str, str] | None = None,
                 extra_args: Sequence[str] | None = None, tls: TLS | None = None) -> None:
        self.name = name
        self.prefix = prefix  # the replica's etcd key prefix (--etcd-prefix)
        self.etcd_endpoints = list(etcd_endpoints or [])
        # how this harness itself talks to the replica (health checks, `stub`, `client()`)
        # when the replica serves TLS (--tls-cert-file): trust `tls.ca`, present `tls.cert`
        self.tls = tls
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.workdir = pathlib.Path(workdir)
        self.log_path = self.workdir / f"{name}.log"
        self.fs_root = pathlib.Path(fs_root) if fs_root else self.workdir / f"{name}-sandbox"
        self.env = {**os.environ, "AGENTTX_LOG_FORMAT": "json", "AGENTTX_REPLICA_ID": name,
                    **(env or {})}
        endpoints = ["--etcd-endpoints", ",".join(etcd_endpoints)] if etcd_endpoints else []
        self.args = [sys.executable, "-m", "agenttx", "serve", "--listen", self.address,
                     *endpoints, "--etcd-prefix", prefix, "--fs-root", str(self.fs_root),
                     "--data-dir", str(self.workdir / f"{name}-data"), "--grace-period-s", "5",
                     *(extra_args or [])]
        self.process: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None

    @property
    def target(self) -> str:
        """`host:port` to give `agenttx.client.Client`."""
        return self.address

    def start(self, timeout: float = 30.0, *, serving: bool = True) -> ServiceProcess:
        """Start the process and wait until it reports SERVING (or, with
        `serving=False`, until its health service answers at all)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self.process = subprocess.Popen(self.args, stdout=logf, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        if serving:
            self.wait_serving(timeout)
        else:
            self.wait_health(("SERVING", "NOT_SERVING"), timeout)
        return self

    def health(self, service: str = "") -> str:
        """The health status name (`SERVING`, `NOT_SERVING`, ...) or `UNREACHABLE`."""
        with self._open_channel() as ch:
            try:
                r = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=1)
            except grpc.RpcError:
                return "UNREACHABLE"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))

    def wait_health(self, statuses: Sequence[str], timeout: float = 30.0,
                    service: str = "") -> str:
        """Poll health until it is one of `statuses`; returns it (TimeoutError if not)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.process.returncode}):\n"
                                   + self.log_path.read_text()[-3000:])
            status = self.health(service)
            if status in statuses:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} health is {status}, not {list(statuses)}, "
                                   f"after {timeout}s")
            time.sleep(0.1)

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Poll the gRPC health check until SERVING; raise with the log tail if the
        process exits first, TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._open_channel() as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.process.returncode}):\n"
                                       + self.log_path.read_text()[-3000:])
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} not serving after {timeout}s")
                time.sleep(0.1)

    def _open_channel(self, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        if self.tls is None:
            return grpc.insecure_channel(self.address, options=list(options))
        return grpc.secure_channel(self.address, self.tls.credentials(), options=list(options))

    def client(self, **kwargs: Any) -> Client:
        """An `agenttx.client.Client` for this replica (close it, or use `with`)."""
        if self.tls is not None:
            kwargs.setdefault("tls", self.tls)
        return Client(self.address, **kwargs)

    def async_client(self, **kwargs: Any) -> AsyncClient:
        return AsyncClient(self.address, **kwargs)

    @property
    def channel(self) -> grpc.Channel:
        """A raw gRPC channel, for tests of the wire protocol itself."""
        if self._channel is None:
            self._channel = self._open_channel(options=[
                ("grpc.max_send_message_length", 8 * 1024 * 1024),
                ("grpc.max_receive_message_length", 8 * 1024 * 1024)])
        return self._channel

    @property
    def stub(self) -> pb_grpc.AgentTxServiceStub:
        return pb_grpc.AgentTxServiceStub(self.channel)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Send `sig` (SIGTERM: drain, then stop) and wait; SIGKILL after `timeout`.
        Returns the exit code."""
        p = self.process
        code: int | None = p.returncode if p else None
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            try:
                code = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait()
        # Closed after the process is gone, so in-flight calls see what a client of a
        # dead server sees (UNAVAILABLE), not a closed local channel.
        if self._channel is not None and sig != signal.SIGKILL:
            self._channel.close()
            self._channel = None
        return code

    def kill(self) -> None:
        """SIGKILL: what a node failure looks like (no drain, no cleanup)."""
        self.stop(signal.SIGKILL)

    def logs(self) -> list[dict[str, Any]]:
        """The replica's JSON log records so far (non-JSON lines skipped)."""
        out: list[dict[str, Any]] = []
        if not self.log_path.exists():
            return out
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def __enter__(self) -> ServiceProcess:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Service:
    """What `serve()` yields: the running replicas and where their state lives."""

    replicas: list[ServiceProcess]
    etcd: EmbeddedEtcd | None
    etcd_endpoints: list[str]
    prefix: str
    fs_root: pathlib.Path
    workdir: pathlib.Path
    _clients: list[Client] = field(default_factory=list, repr=False)

    @property
    def process(self) -> ServiceProcess:
        """The first replica."""
        return self.replicas[0]

    @property
    def target(self) -> str:
        """`host:port` of the first replica."""
        return self.replicas[0].address

    @property
    def targets(self) -> list[str]:
        return [r.address for r in self.replicas]

    def client(self, replica: int = 0, **kwargs: Any) -> Client:
        """A `Client` for replica `replica`; closed when the `serve()` block ends."""
        c = Client(self.replicas[replica].address, **kwargs)
        self._clients.append(c)
        return c

    def async_client(self, replica: int = 0, **kwargs: Any) -> AsyncClient:
        """An `AsyncClient` (close it yourself: `async with svc.async_client() as c`)."""
        return AsyncClient(self.replicas[replica].address, **kwargs)

    def logs(self) -> list[dict[str, Any]]:
        """Every replica's JSON log records, replica by replica."""
        return [rec for r in self.replicas for rec in r.logs()]


@contextlib.contextmanager
def serve(*, replicas: int = 1, env: Mapping[str, str] | None = None,
          extra_args: Sequence[str] | None = None,
          fs_root: str | os.PathLike[str] | None = None,
          etcd_endpoints: Sequence[str] | None = None, prefix: str | None = None,
          workdir: str | os.PathLike[str] | None = None,
          start_timeout: float = 60.0) -> Iterator[Service]:
    """Start a real etcd and `replicas` `agenttx serve` processes sharing it; stop them all
    (and remove the temporary directory) when the block ends.

    - `etcd_endpoints`: use an etcd you already run instead of starting one; the key
      prefix is then random (`/agenttx-test-<hex>`) unless `prefix` is given.
    - `fs_root`: the sandbox of the fs tools (default: `<workdir>/sandbox`), shared by
      every replica, exposed as `svc.fs_root`.
    - `env`, `extra_args`: added to every replica's environment / command line, e.g.
      `env={"AGENTTX_EFFECT_CHANNELS": json.dumps({...})}`,
      `extra_args=["--tx-idle-timeout-s", "5"]`.
    """
    own_root = workdir is None
    root = scratch_dir("agenttx-testing-") if own_root else pathlib.Path(workdir or ".")
    root.mkdir(parents=True, exist_ok=True)
    sandbox = pathlib.Path(fs_root) if fs_root else root / "sandbox"
    sandbox.mkdir(parents=True, exist_ok=True)
    etcd: EmbeddedEtcd | None = None
    procs: list[ServiceProcess] = []
    service: Service | None = None
    try:
        if etcd_endpoints is None:
            etcd = EmbeddedEtcd(root / "etcd").start(timeout=start_timeout)
            endpoints = list(etcd.endpoints)
            chosen_prefix = prefix or "/agenttx"
        else:
            endpoints = list(etcd_endpoints)
            chosen_prefix = prefix or f"/agenttx-test-{uuid.uuid4().hex[:12]}"
        for i in range(replicas):
            proc = ServiceProcess(f"agenttx-{i}", etcd_endpoints=endpoints, prefix=chosen_prefix,
                                  fs_root=sandbox, workdir=root, env=env, extra_args=extra_args)
            procs.append(proc)
            proc.start(timeout=start_timeout)
        service = Service(procs, etcd, endpoints, chosen_prefix, sandbox, root)
        yield service
    finally:
        if service is not None:
            for c in service._clients:
                c.close()
        for proc in procs:
            proc.stop()
        if etcd is not None:
            etcd.stop()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)
