"""e2e fixtures: opt-in, and skipped with a reason when the tools or a cluster are missing.

Run them with `make e2e` (or `AGENTTX_E2E=1 pytest tests/e2e`, or `pytest tests/e2e
--e2e`). Without the opt-in, `pytest tests/` just skips them: nothing here runs a command
at import or collection time.

Environment: AGENTTX_E2E_CLUSTER (kind cluster name, default agenttx-e2e; reused when it
exists), AGENTTX_E2E_KEEP=1 (keep a cluster this run created), AGENTTX_E2E_NAMESPACE
(release namespace).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from e2e_cluster import (
    Cluster,
    create_cluster,
    docker_reachable,
    install,
    missing_tools,
    opted_in,
    teardown,
)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if not opted_in(request.config):
        pytest.skip("e2e tests are opt-in: run `make e2e`, `AGENTTX_E2E=1 pytest tests/e2e` "
                    "or `pytest tests/e2e --e2e` (needs kind, docker, kubectl and helm)")
    missing = missing_tools()
    if missing:
        pytest.skip(f"e2e needs {', '.join(missing)} on PATH (see docs/kubernetes.md)")
    if not docker_reachable():
        pytest.skip("e2e needs a running Docker engine: `docker info` failed")
    c = create_cluster()
    if c.kubectl("cluster-info", check=False, timeout=60).returncode != 0:
        teardown(c)
        pytest.skip(f"no reachable cluster for context {c.context}")
    try:
        install(c)
        yield c
    finally:
        teardown(c)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test (deleted afterwards, finalizers and all)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
