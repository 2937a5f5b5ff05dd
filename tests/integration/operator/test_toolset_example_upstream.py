"""examples/toolsets/upstream/server.py, the upstream of the example toolsets, run on
loopback as `kubectl apply -f examples/toolsets/` runs it in a pod: the operator's own
tools/list check accepts both example toolsets against it with the example Secret's
header, refuses a missing header (HTTP 401), and a compensation call is logged as a
person would read it with `kubectl logs`."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agenttx.embedded_etcd import free_port
from agenttx_operator import toolset_spec, upstream
from support.waiting import eventually, eventually_async, slack

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples" / "toolsets"
HEADER = yaml.safe_load((EXAMPLES / "secret.yaml").read_text())["stringData"]["header"]


def example(name: str, url: str):
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc["spec"]["upstream"]["url"] = url
    return toolset_spec.parse("team-a", doc["metadata"]["name"], 1, doc["spec"])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def example_upstream(tmp_path_factory) -> Iterator[tuple[str, str, pathlib.Path]]:
    tickets, mail = free_port(), free_port()
    out = tmp_path_factory.mktemp("upstream") / "stdout"
    env = {**os.environ, "HOST": "127.0.0.1", "TICKETS_PORT": str(tickets),
           "MAIL_PORT": str(mail), "TICKETS_AUTHORIZATION": HEADER + "\n"}
    with out.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-u", str(EXAMPLES / "upstream" / "server.py")],
                                env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        eventually(lambda: proc.poll() is None and listening(tickets) and listening(mail),
                   slack(10), "the example upstream listens on both ports")
        yield (f"http://127.0.0.1:{tickets}/mcp", f"http://127.0.0.1:{mail}/mcp", out)
    finally:
        proc.terminate()
        proc.wait(10)


async def test_the_operator_accepts_both_example_toolsets_against_the_example_upstream(
        example_upstream) -> None:
    tickets_url, mail_url, _ = example_upstream
    tickets = example("tickets.yaml", tickets_url)
    offered = await upstream.list_tools(tickets.upstream, {"Authorization": HEADER})
    assert offered == {"create_ticket", "close_ticket", "search_tickets", "add_comment",
                       "delete_comment"}
    assert toolset_spec.missing_tools(tickets, offered) == []
    mail = example("mail.yaml", mail_url)
    assert toolset_spec.missing_tools(mail, await upstream.list_tools(mail.upstream, {})) == []


async def test_the_example_tracker_refuses_a_request_without_the_secret_header(
        example_upstream) -> None:
    tickets_url, _, _ = example_upstream
    with pytest.raises(upstream.UpstreamUnreachable) as exc:
        await upstream.list_tools(example("tickets.yaml", tickets_url).upstream, {})
    assert str(exc.value) == f"{tickets_url} answered HTTP 401 Unauthorized"


async def test_a_compensation_shows_in_the_upstream_log(example_upstream) -> None:
    tickets_url, _, out = example_upstream
    async with httpx2.AsyncClient(headers={"Authorization": HEADER}) as http, Client(
            streamable_http_client(tickets_url, http_client=http)) as client:
        created = await client.call_tool("create_ticket", {"title": "printer on fire"},
                                         meta={"io.agenttx/idempotency-key": "tx-1/1/1"})
        ticket = created.structured_content
        assert ticket is not None and ticket["status"] == "open"
        closed = await client.call_tool("close_ticket", {"id": ticket["id"],
                                                         "reason": "rolled back by AgentTx"})
        assert closed.structured_content == {"id": ticket["id"], "title": "printer on fire",
                                             "priority": 3, "status": "closed"}

    async def logged() -> bool:
        return (f"tickets close_ticket id={ticket['id']!r} reason='rolled back by AgentTx'"
                in out.read_text())
    await eventually_async(logged, slack(2), "the close_ticket line in the upstream's log")
    assert (f"tickets create_ticket id={ticket['id']!r} title='printer on fire' "
            "idempotency_key='tx-1/1/1'") in out.read_text()
