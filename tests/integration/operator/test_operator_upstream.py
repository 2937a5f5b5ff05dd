"""The operator's tools/list check (`agenttx_operator.upstream`) against real servers on
loopback: what it returns, and how each way an upstream can fail reads in the status,
always within the bound its timeout sets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from agenttx.contracts.toolsets import Upstream
from agenttx.embedded_etcd import free_port
from agenttx_operator import upstream
from support.mcp_upstreams import mailer, tracker
from support.waiting import slack


@pytest.fixture
def silent() -> Iterator[str]:
    """A server that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/mcp"


async def test_lists_every_tool_of_a_real_mcp_server() -> None:
    with tracker() as t, mailer() as m:
        assert await upstream.list_tools(Upstream(t.url, (), 2.0), {}) == {
            "create_ticket", "close_ticket", "search_tickets", "add_comment", "delete_comment",
            "tracker_status"}
        assert await upstream.list_tools(Upstream(m.url, (), 2.0), {}) == {"send_email"}


async def test_an_upstream_that_never_answers_is_unreachable_within_its_timeout(
        silent: str) -> None:
    started = time.monotonic()
    with pytest.raises(upstream.UpstreamUnreachable) as exc:
        await upstream.list_tools(Upstream(silent, (), 1.0), {})
    assert time.monotonic() - started < slack(1.0 * upstream.REQUESTS_PER_LISTING)
    assert str(exc.value).startswith(f"{silent}: timed out") or str(exc.value) == (
        f"{silent} did not answer tools/list within 3s (timeoutSeconds 1)")


async def test_a_closed_port_is_unreachable_saying_it_cannot_connect() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(upstream.UpstreamUnreachable) as exc:
        await upstream.list_tools(Upstream(url, (), 1.0), {})
    assert str(exc.value).startswith(f"{url}: cannot connect (")


async def test_a_server_that_is_not_mcp_is_unreachable_with_its_http_status() -> None:
    with tracker() as t:
        wrong_path = t.url.removesuffix("/mcp") + "/not-mcp"
        with pytest.raises(upstream.UpstreamUnreachable) as exc:
            await upstream.list_tools(Upstream(wrong_path, (), 2.0), {})
    assert str(exc.value) == f"{wrong_path} answered HTTP 404 Not Found"
