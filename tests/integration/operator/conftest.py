"""Fixtures for the operator's kopf wiring tests (helpers live in operator_kmock.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from operator_kmock import (
    DEPLOYMENTS,
    EVENTS,
    POLICIES,
    PVCS,
    SECRETS,
    SERVICE_NS,
    TOOLSETS,
    ApiServer,
    service_deployment,
)

from agenttx.embedded_etcd import free_port
from agenttx.store.client import Store, connect
from agenttx_operator.config import OperatorConfig


@pytest.fixture
def api(kmock: ApiServer) -> ApiServer:
    kmock.resources[POLICIES] = kmock.ResourceInfo(
        kind="AgentTxPolicy", singular="agenttxpolicy", namespaced=True,
        subresources={"status"}, verbs={"get", "list", "watch", "patch", "create", "delete"},
    )
    kmock.resources[TOOLSETS] = kmock.ResourceInfo(
        kind="AgentTxToolset", singular="agenttxtoolset", namespaced=True,
        subresources={"status"}, verbs={"get", "list", "watch", "patch", "create", "delete"},
    )
    kmock.resources[SECRETS] = kmock.ResourceInfo(
        kind="Secret", namespaced=True, verbs={"get", "create", "patch", "delete"})
    kmock.resources[PVCS] = kmock.ResourceInfo(
        kind="PersistentVolumeClaim", namespaced=True,
        verbs={"get", "create", "patch", "delete"})
    kmock.resources[DEPLOYMENTS] = kmock.ResourceInfo(
        kind="Deployment", namespaced=True, verbs={"get", "patch"})
    kmock.resources[EVENTS] = kmock.ResourceInfo(kind="Event", namespaced=True,
                                                 verbs={"create"})
    # kopf resolves its "backbone" resources (namespaces) at startup, even cluster-wide.
    kmock.resources["v1/namespaces"] = kmock.ResourceInfo(
        kind="Namespace", namespaced=False, verbs={"list", "watch"})
    kmock.objects[DEPLOYMENTS, SERVICE_NS, "agenttx"] = service_deployment()
    return kmock


@pytest.fixture
def make_config(etcd_endpoint: str, etcd_prefix: str) -> Callable[..., OperatorConfig]:
    def make(**overrides: Any) -> OperatorConfig:
        values: dict[str, Any] = dict(
            etcd_endpoints=[etcd_endpoint], etcd_prefix=etcd_prefix,
            service_namespace=SERVICE_NS, liveness_host="127.0.0.1",
            liveness_port=free_port(), etcd_timeout_s=1.0, etcd_retry_base_s=0.2,
            etcd_retry_max_s=1.0, volume_poll_s=0.3, sweep_interval_s=3600,
            upstream_retry_base_s=0.2, upstream_retry_max_s=1.0, toolset_resync_s=3600,
        )
        values.update(overrides)
        return OperatorConfig(_cli_parse_args=[], **values)
    return make


@pytest.fixture
async def store(etcd_endpoint: str) -> AsyncIterator[Store]:
    s = connect([etcd_endpoint], timeout=5.0)
    yield s
    await s.close()
