"""Shared fixtures: a real etcd on loopback for every test that touches state.

Data dirs go on /dev/shm when it exists (fast fsync; `agenttx.testing.scratch_dir`); each
session gets its own folder, removed afterwards. No in-memory store or mocked etcd
anywhere. Service processes come from the public harness, `agenttx.testing`.
"""

from __future__ import annotations

import pathlib
import shutil
import uuid
from collections.abc import Iterator

import pytest

from agenttx.embedded_etcd import EmbeddedEtcd
from agenttx.testing import scratch_dir

# Real loopback HTTP and SMTP receivers (fixtures `webhook`, `smtp`).
pytest_plugins = ["support.receivers"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--e2e", action="store_true", default=False,
                     help="run the kind e2e tests in tests/e2e (needs kind, docker, kubectl, "
                     "helm); AGENTTX_E2E=1 does the same")


@pytest.fixture(scope="session")
def scratch() -> Iterator[pathlib.Path]:
    root = scratch_dir("agenttx-test-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def etcd(scratch: pathlib.Path) -> Iterator[EmbeddedEtcd]:
    """One real single-member etcd for the whole session."""
    server = EmbeddedEtcd(scratch / "etcd").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_endpoint(etcd: EmbeddedEtcd) -> str:
    return etcd.endpoints[0]


@pytest.fixture
def etcd_prefix() -> str:
    """A fresh key prefix per test, so tests sharing one etcd never see each other."""
    return f"/agenttx-test-{uuid.uuid4().hex[:12]}"
