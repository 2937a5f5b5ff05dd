"""e2e fixtures: opt-in, and skipped with a reason when the tools or a cluster are missing.

Run them with `make e2e` (or `AGENTTX_E2E=1 pytest tests/e2e`, or `pytest tests/e2e
--e2e`). Without the opt-in, `pytest tests/` just skips them: nothing here runs a command
at import or collection time.

Environment: AGENTTX_E2E_CLUSTER (kind cluster name, default agenttx-e2e; reused when it
exists), AGENTTX_E2E_KEEP=1 (keep a cluster this run created), AGENTTX_E2E_NAMESPACE
(release namespace).

The chart runs with `auth.mode=kubernetes`: `agent_token` is a ServiceAccount token
(audience `agenttx`) of the test's own namespace, so that namespace's policies apply to
the calls made with it (docs/security.md#policy-and-sandbox-scope).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from e2e_cluster import (
    AGENT,
    Cluster,
    create_cluster,
    docker_reachable,
    install,
    missing_tools,
    opted_in,
    teardown,
)

# pyproject's `timeout = 300` is per test, and the first e2e test also pays for the
# session's setup: a kind cluster, a docker build, `helm install --wait`. The waits in the
# tests are bounded by their own deadlines (e2e_cluster.wait_for).
E2E_TIMEOUT_S = 3600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))


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


@pytest.fixture
def agent_token(cluster: Cluster, namespace: str) -> str:
    """A token of ServiceAccount `agent` in the test's namespace: the principal
    system:serviceaccount:<namespace>:agent."""
    cluster.service_account(AGENT, namespace)
    return cluster.token(AGENT, namespace)
