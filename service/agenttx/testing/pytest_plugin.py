"""pytest fixtures for code that runs against AgentTx: a real service per test session.

Enable in your conftest.py (it is not auto-loaded):

    pytest_plugins = ["agenttx.testing.pytest_plugin"]

    @pytest.fixture(scope="session")
    def agenttx_service_options():            # optional: how to start the service
        return {"env": {"MY_TOOL_DIR": "/tmp/x"}, "extra_args": ["--tx-idle-timeout-s", "30"]}

    def test_my_tool(agenttx_client):
        with agenttx_client.transaction() as tx:
            assert tx.step("my.tool", {"id": "a"}).ok

Fixtures: `agenttx_service_options` (session; kwargs for `agenttx.testing.serve`),
`agenttx_service` (session; the running `Service`), `agenttx_client` (a `Client` per
test). Every test shares the session's service: give keys, rows and files unique names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..client import Client
from . import Service, serve


@pytest.fixture(scope="session")
def agenttx_service_options() -> dict[str, Any]:
    """Keyword arguments for `agenttx.testing.serve()`; override to pass env/flags."""
    return {}


@pytest.fixture(scope="session")
def agenttx_service(agenttx_service_options: dict[str, Any]) -> Iterator[Service]:
    """A real etcd and `agenttx serve`, started once per session and stopped after it."""
    with serve(**agenttx_service_options) as svc:
        yield svc


@pytest.fixture
def agenttx_client(agenttx_service: Service) -> Iterator[Client]:
    with Client(agenttx_service.target) as client:
        yield client
