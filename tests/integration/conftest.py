"""Two real service replicas sharing one real etcd, for the whole session."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator

import pytest

from agenttx.embedded_etcd import EmbeddedEtcd
from agenttx.store.client import connect
from support.service import Agent, ServiceProcess

PREFIX = "/agenttx-it"


@pytest.fixture(scope="session")
def sandbox(scratch: pathlib.Path) -> pathlib.Path:
    root = scratch / "sandbox"
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def replicas(etcd: EmbeddedEtcd, scratch: pathlib.Path,
             sandbox: pathlib.Path) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    # The session's tests leave many transactions open under the one anonymous principal:
    # lift the per-principal quota (docs/security.md#quotas) so they never collide with it.
    procs = [ServiceProcess(name, etcd_endpoints=etcd.endpoints, prefix=PREFIX,
                            fs_root=str(sandbox), workdir=scratch / "replicas",
                            env={"AGENTTX_MAX_OPEN_TRANSACTIONS": "1000000"})
             for name in ("replica-a", "replica-b")]
    for p in procs:
        p.start()
    yield procs[0], procs[1]
    for p in procs:
        p.stop()


@pytest.fixture
def a(replicas):
    return replicas[0].stub


@pytest.fixture
def b(replicas):
    return replicas[1].stub


@pytest.fixture
def agent(a) -> Agent:
    return Agent(a)


@pytest.fixture
def uniq() -> str:
    """A fresh suffix so tests sharing the replicas never touch each other's keys."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def store(etcd):
    s = connect(etcd.endpoints)
    yield s
    await s.close()
