"""`agenttx bench --peers`: the same workflow on the systems people compare AgentTx with,
in the same run, on the same machine.

The shape is the one `agenttx bench` measures for AgentTx: begin, 10 writes, commit, by
one agent, one after another.

* **LangGraph** with its PostgreSQL checkpointer (`langgraph-checkpoint-postgres`),
  durability `sync`: a graph of 10 nodes, each writing one key into the state; every
  node's state is checkpointed to PostgreSQL before the next node runs. A new thread id
  per workflow is the "begin"; the last checkpoint is the "commit".
* **DBOS** (`dbos`): a `@DBOS.workflow()` calling 10 `@DBOS.step()` functions, each
  returning the value it writes; DBOS records every step's output in its system
  database (PostgreSQL) before the next one runs, and the workflow's outcome at the end.

Both run against a real PostgreSQL this module starts itself on loopback (a fresh
cluster in a temporary directory, Debian's `postgresql` binaries; as root it runs them as
the `postgres` user, since PostgreSQL refuses to run as root). When the binaries or the
Python packages (extra `[bench]`) are missing, the peers are skipped with a reason, never
faked.

A "step" of a peer is the time from one node (step) starting to the next one starting:
it includes the durable write of the previous one, as an AgentTx ExecuteStep includes
its CAS. Figures are reported next to AgentTx's as ratios to the same raw etcd CAS.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

STEPS = 10
PG_BIN_DIRS = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin",
               "/usr/lib/postgresql/15/bin")


class Skipped(Exception):
    """A peer cannot run here; the message says why."""


def _summary(values: list[float]) -> dict[str, float]:
    from .perf import summary

    return summary(values)


# ---- PostgreSQL on loopback ------------------------------------------------------------

def _pg_bin(name: str) -> str:
    for d in PG_BIN_DIRS:
        candidate = pathlib.Path(d) / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise Skipped(f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A fresh PostgreSQL cluster on 127.0.0.1 for the duration; yields its URL."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    as_user: list[str] = []
    base = pathlib.Path(tempfile.mkdtemp(prefix="agenttx-peers-pg-",
                                         dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            raise Skipped("running as root and runuser is missing: PostgreSQL refuses root")
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres", "postgres")
    data = base / "data"
    port = _free_port()
    log = base / "postgres.log"

    def run(cmd: list[str]) -> None:
        done = subprocess.run(as_user + cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Skipped(f"{pathlib.Path(cmd[0]).name} failed: "
                          f"{(done.stderr or done.stdout).strip()[:300]}")

    try:
        run([initdb, "-D", str(data), "-U", "bench", "--auth=trust", "-E", "UTF8"])
        # durable like a production database: fsync and synchronous commit stay on
        run([pg_ctl, "-D", str(data), "-l", str(log), "-w", "-o",
             f"-h 127.0.0.1 -p {port} -k {base} -c max_connections=100", "start"])
        yield f"postgresql://bench@127.0.0.1:{port}/postgres"
    finally:
        if data.exists():
            subprocess.run(as_user + [pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"],
                           capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)


# ---- LangGraph ----------------------------------------------------------------------------

def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {**a, **b}


class _GraphState(TypedDict):
    """The LangGraph workflow's state: one key per write, merged node by node."""

    data: Annotated[dict[str, int], _merge]


def langgraph_workflows(url: str, count: int) -> dict[str, Any]:
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:
        raise Skipped(f"langgraph is not installed ({exc.name}); pip install 'agenttx[bench]'") from None
    starts: list[float] = []

    def node(i: int) -> Any:
        def write(state: _GraphState) -> dict[str, Any]:
            starts.append(time.perf_counter())
            return {"data": {f"k{i}": i}}
        return write

    graph = StateGraph(_GraphState)
    for i in range(STEPS):
        graph.add_node(f"w{i}", node(i))
        graph.add_edge(START if i == 0 else f"w{i - 1}", f"w{i}")
    graph.add_edge(f"w{STEPS - 1}", END)
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        app = graph.compile(checkpointer=saver)

        def one() -> float:
            starts.clear()
            t0 = time.perf_counter()
            out = app.invoke({"data": {}}, {"configurable": {"thread_id": uuid.uuid4().hex}},
                             durability="sync")
            elapsed = time.perf_counter() - t0
            if len(out["data"]) != STEPS:
                raise RuntimeError(f"langgraph wrote {len(out['data'])} keys, not {STEPS}")
            return elapsed

        for _ in range(3):
            one()
        total, step_ms = 0.0, []
        for _ in range(count):
            total += one()
            step_ms += [(b - a) * 1000 for a, b in zip(starts, starts[1:], strict=False)]
    return {"workflows": count, "per_s": round(count / total, 1), "step_ms": _summary(step_ms),
            "durability": "sync", "checkpointer": "PostgresSaver"}


# ---- DBOS ------------------------------------------------------------------------------

def dbos_workflows(url: str, count: int) -> dict[str, Any]:
    try:
        from dbos import DBOS
    except ImportError as exc:
        raise Skipped(f"dbos is not installed ({exc.name}); pip install 'agenttx[bench]'") from None
    starts: list[float] = []
    DBOS(config={"name": "agenttx-bench-peers", "system_database_url": url,
                 "log_level": "WARNING"})

    @DBOS.step()
    def write(i: int) -> int:
        starts.append(time.perf_counter())
        return i

    @DBOS.workflow()
    def workflow() -> int:
        return sum(write(i) for i in range(STEPS))

    DBOS.launch()
    try:
        def one() -> float:
            starts.clear()
            t0 = time.perf_counter()
            result = workflow()
            elapsed = time.perf_counter() - t0
            if result != sum(range(STEPS)):
                raise RuntimeError(f"dbos workflow returned {result}")
            return elapsed

        for _ in range(3):
            one()
        total, step_ms = 0.0, []
        for _ in range(count):
            total += one()
            step_ms += [(b - a) * 1000 for a, b in zip(starts, starts[1:], strict=False)]
    finally:
        DBOS.destroy(destroy_registry=True)
    return {"workflows": count, "per_s": round(count / total, 1), "step_ms": _summary(step_ms)}


# ---- all peers ---------------------------------------------------------------------------

def run_peers(count: int, progress: Any = None) -> dict[str, Any]:
    """Every peer's figures, or the reason it was skipped."""
    out: dict[str, Any] = {}
    try:
        with postgres() as url:
            for name, fn in (("langgraph_postgres", langgraph_workflows),
                             ("dbos", dbos_workflows)):
                if progress:
                    progress(f"peers: {name}, {count} workflows against PostgreSQL")
                try:
                    out[name] = fn(url, count)
                except Skipped as exc:
                    out[name] = {"skipped": str(exc)}
    except Skipped as exc:
        out = {"langgraph_postgres": {"skipped": str(exc)}, "dbos": {"skipped": str(exc)}}
    return out


__all__ = ["Skipped", "dbos_workflows", "langgraph_workflows", "postgres", "run_peers"]
