"""`agenttx mcp` driven by the `mcp` SDK's own client, over stdio and streamable HTTP.

A real `agenttx mcp` process in front of a real replica (real etcd): the tool list with
schemas and truthful annotations; a transaction with a failing step whose result carries
the hint, category, strategy and next step; commit delivering an effect to a loopback
webhook; per-session state (`Mcp-Session-Id`) and handles under the stateless revision;
open transactions aborted when the MCP server goes away.

The replica runs with max_local_depth 1 and max_global_resets 0, so every strategy is a
couple of calls away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError

from agenttx.client import Client, NotFound
from agenttx.embedded_etcd import free_port
from agenttx.mcp_server.catalog import CONTROL_TOOLS, HANDLE_SCHEMA, mcp_name
from agenttx.testing import ServiceProcess
from agenttx.tools.registry import ToolRegistry
from agenttx.tools.schema import input_schema
from support.receivers import WebhookReceiver

MODERN = "2026-07-28"


def _wait(cond: Any, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def svc(etcd, scratch, sandbox, hooks) -> Iterator[ServiceProcess]:
    channels = {"hooks": {"kind": "webhook", "url": hooks.url, "timeout_s": 2}}
    proc = ServiceProcess("mcp-svc", etcd_endpoints=etcd.endpoints,
                          prefix=f"/agenttx-mcp-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                          workdir=scratch / "mcp",
                          env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels),
                               "AGENTTX_DEFAULT_POLICY__MAX_LOCAL_DEPTH": "1",
                               "AGENTTX_DEFAULT_POLICY__MAX_GLOBAL_RESETS": "0"}).start()
    yield proc
    proc.stop()


def stdio(target: str, agent_id: str = "mcp-stdio") -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[
        "-m", "agenttx", "mcp", "--target", target, "--agent-id", agent_id])


def _http_server(target: str, log_path: Any) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenttx", "mcp", "--transport", "http", "--listen",
             f"127.0.0.1:{port}", "--agent-id", "mcp-http"],
            env={**os.environ, "AGENTTX_TARGET": target}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def accepting() -> bool:
        assert proc.poll() is None, open(log_path).read()[-3000:]
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    _wait(accepting, 60, "agenttx mcp --transport http listening")
    return proc, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def http_url(svc, scratch) -> Iterator[str]:
    proc, url = _http_server(svc.target, scratch / "mcp-http.log")
    yield url
    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal (exit status -SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM


def text(result: Any) -> str:
    [block] = result.content
    return str(block.text)


def _keys(hooks: WebhookReceiver, key: str) -> int:
    return hooks.keys().get(key, 0)


# ---- the tool list -------------------------------------------------------------------------

async def test_every_tool_is_listed_with_its_schema_and_truthful_annotations(svc):
    registry = ToolRegistry.load()
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
    assert set(tools) == {mcp_name(n) for n in registry.names()} | set(CONTROL_TOOLS)
    assert all("." not in name for name in tools)
    for name in registry.names():
        schema = tools[mcp_name(name)].input_schema
        expected = input_schema(registry.get(name).fields, references=False)
        assert schema == {**expected, "properties": {**expected["properties"],
                                                      "transaction": HANDLE_SCHEMA}}, name
    wire = {n: t.model_dump(by_alias=True, exclude_none=True, mode="json")["annotations"]
            for n, t in tools.items()}
    assert wire["kv_get"] == {"title": "kv.get", "readOnlyHint": True, "openWorldHint": False}
    assert wire["fs_read"]["readOnlyHint"] is True and wire["record_get"]["readOnlyHint"] is True
    for staged in ("kv_put", "kv_delete", "record_insert"):
        assert wire[staged] == {"title": staged.replace("_", "."), "readOnlyHint": False,
                                "destructiveHint": False, "idempotentHint": False,
                                "openWorldHint": False}, staged
    assert wire["effect_stage"] == {"title": "effect.stage", "readOnlyHint": False,
                                    "destructiveHint": False, "idempotentHint": False,
                                    "openWorldHint": True}
    assert wire["fs_write"]["destructiveHint"] is True  # on disk at once, overwrites
    assert wire["agenttx_status"]["readOnlyHint"] is True
    assert wire["agenttx_commit"]["destructiveHint"] is True
    assert "nothing is committed until agenttx_commit" in tools["kv_put"].description
    assert tools["agenttx_rollback"].input_schema["properties"]["to_step"]["minimum"] == 1


# ---- a session over stdio ------------------------------------------------------------------

async def test_a_session_runs_a_transaction_with_a_failing_step_then_commits(svc, hooks,
                                                                            sandbox, uniq):
    key = f"mcp-{uniq}"
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        first = await mcp.call_tool("record_insert", {"table": f"customers_{uniq}", "id": 1,
                                                      "fields": {"name": "Ada"}})
        tx = first.structured_content["transaction"]
        assert not first.is_error
        assert text(first).startswith(f"Began transaction {tx}. Step 1 (record_insert) "
                                      "succeeded. Output: ")
        bad = await mcp.call_tool("record_insert", {
            "table": f"orders_{uniq}", "id": "o-1", "fields": {"customer_id": 2},
            "references": {"customer_id": f"customers_{uniq}"}})
        assert bad.is_error
        s = bad.structured_content
        assert (s["transaction"], s["step_id"], s["category"], s["strategy"], s["next_step_id"]) \
            == (tx, 2, "foreign_key_violation", "LOCAL_BACKTRACK", 2)
        assert text(bad).splitlines() == [
            "Step 2 (record_insert) failed: foreign_key_violation.",
            f"Hint: {s['hint']}",
            "Recovery (LOCAL_BACKTRACK): Nothing was undone. Retry step 2, changed as the hint "
            "says.",
            f"Transaction {tx}.",
        ]
        assert f'"customers_{uniq}"' in s["hint"] and '"2"' in s["hint"]
        fixed = await mcp.call_tool("record_insert", {
            "table": f"orders_{uniq}", "id": "o-1", "fields": {"customer_id": "${steps.1.id}"},
            "references": {"customer_id": f"customers_{uniq}"}})
        assert not fixed.is_error and fixed.structured_content["output"]["fields"] == \
            {"customer_id": 1}
        assert not (await mcp.call_tool("fs_write", {"path": f"mcp-{uniq}.txt",
                                                     "contents": "receipt"})).is_error
        assert (sandbox / f"mcp-{uniq}.txt").read_text() == "receipt"
        staged = await mcp.call_tool("effect_stage", {"channel": "hooks", "idempotency_key": key,
                                                      "payload": {"order": "o-1"}})
        assert not staged.is_error and _keys(hooks, key) == 0  # nothing sent before commit
        status = await mcp.call_tool("agenttx_status", {})
        assert text(status).splitlines() == [
            f"Transaction {tx}: ACTIVE, next step 5, 0 global resets.",
            "Constraints learned so far:", f"- {s['hint']}"]
        done = await mcp.call_tool("agenttx_commit", {})
        assert not done.is_error
        assert text(done) == f"Committed transaction {tx}: 4 steps, 1 effect delivered."
        [delivery] = [r for r in hooks.requests if r["headers"].get("Idempotency-Key") == key]
        assert json.loads(delivery["body"]) == {"channel": "hooks", "payload": {"order": "o-1"},
                                                "idempotency_key": key, "transaction_id": tx}
        # the next call begins a new transaction, which sees the committed row
        read = await mcp.call_tool("record_get", {"table": f"orders_{uniq}", "id": "o-1"})
        assert read.structured_content["transaction"] != tx
        assert text(read).startswith("Began transaction ")
        assert read.structured_content["output"]["fields"] == {"customer_id": 1}
        await mcp.call_tool("agenttx_rollback", {})


async def test_dependency_jump_abort_and_rollback_read_as_instructions(svc, uniq):
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        await mcp.call_tool("kv_put", {"key": f"who-{uniq}", "value": f"c-{uniq}"})
        jump = await mcp.call_tool("record_insert", {
            "table": "orders", "id": f"o-{uniq}", "fields": {"customer_id": "${steps.1.value}"},
            "references": {"customer_id": f"customers_{uniq}"}})
        assert jump.is_error and jump.structured_content["strategy"] == "DEPENDENCY_JUMP"
        assert ("Recovery (DEPENDENCY_JUMP): AgentTx traced the failure back to step 1 and "
                "undid step 1. Continue from step 1: redo it, changed as the hint says.") \
            in text(jump)
        tx = jump.structured_content["transaction"]
        # two failures at one step: local depth 1 exhausted, no resets allowed -> ABORT
        await mcp.call_tool("kv_get", {"key": f"missing-{uniq}"})
        abort = await mcp.call_tool("kv_get", {"key": f"missing-{uniq}"})
        assert abort.is_error and abort.structured_content["next_step_id"] == 0
        assert "Recovery (ABORT): The transaction was aborted (" in text(abort)
        assert "The next tool call begins a new transaction." in text(abort)
        assert text(await mcp.call_tool("agenttx_status", {})) == \
            "No transaction is open; the next tool call begins one."
        with Client(svc.target) as client, pytest.raises(NotFound):
            client.get(tx)

        again = await mcp.call_tool("kv_put", {"key": f"a-{uniq}", "value": 1})
        second = again.structured_content["transaction"]
        assert second != tx
        await mcp.call_tool("kv_put", {"key": f"b-{uniq}", "value": 2})
        rewind = await mcp.call_tool("agenttx_rollback", {"to_step": 2})
        assert text(rewind) == (f"Undid the steps from 2 on (1 undo action); transaction "
                                f"{second} continues at step 2.")
        begin = await mcp.call_tool("agenttx_begin", {})
        assert begin.is_error and f"Transaction {second} is already open" in text(begin)
        aborted = await mcp.call_tool("agenttx_rollback", {})
        assert text(aborted) == (f"Aborted transaction {second}: everything was undone "
                                 "(1 undo action). The next tool call begins a new transaction.")
        nothing = await mcp.call_tool("agenttx_commit", {})
        assert nothing.is_error and text(nothing) == \
            "No transaction is open, so there is nothing to commit."
        with pytest.raises(MCPError, match="Unknown tool: kv.put"):
            await mcp.call_tool("kv.put", {"key": "x"})


async def test_the_stateless_revision_uses_the_transaction_handle(svc, uniq):
    async with McpClient(stdio(svc.target), mode=MODERN) as mcp:
        begun = await mcp.call_tool("agenttx_begin", {})
        tx = begun.structured_content["transaction"]
        assert text(begun) == (f"Began transaction {tx}; the next step is 1. Your client keeps "
                               f"no session: pass \"transaction\": \"{tx}\" to every AgentTx "
                               "tool call.")
        one = await mcp.call_tool("kv_put", {"key": f"h-{uniq}", "value": 1, "transaction": tx})
        two = await mcp.call_tool("kv_get", {"key": f"h-{uniq}", "transaction": tx})
        assert (one.structured_content["step_id"], two.structured_content["step_id"]) == (1, 2)
        assert two.structured_content["output"]["value"] == 1
        # without the handle there is nothing to remember it by: a new transaction
        other = await mcp.call_tool("kv_put", {"key": f"o-{uniq}", "value": 1})
        assert other.structured_content["transaction"] != tx
        assert "your client keeps no session, so pass" in text(other)
        await mcp.call_tool("agenttx_rollback", {"transaction": other.structured_content[
            "transaction"]})
        status = await mcp.call_tool("agenttx_status", {})
        assert not status.is_error and "pass the handle agenttx_begin returned" in text(status)
        done = await mcp.call_tool("agenttx_commit", {"transaction": tx})
        assert text(done) == f"Committed transaction {tx}: 2 steps, 0 effects delivered."
        gone = await mcp.call_tool("kv_get", {"key": f"h-{uniq}", "transaction": tx})
        assert gone.is_error and text(gone).startswith("The transaction no longer exists")


async def test_open_transactions_are_aborted_when_the_stdio_server_exits(svc, sandbox, uniq):
    path = sandbox / f"left-open-{uniq}.txt"
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        r = await mcp.call_tool("fs_write", {"path": path.name, "contents": "uncommitted"})
        tx = r.structured_content["transaction"]
        assert path.read_text() == "uncommitted"
    _wait(lambda: not path.exists(), what="the open transaction's fs write undone")
    with Client(svc.target) as client, pytest.raises(NotFound):
        client.get(tx)


async def test_an_unreachable_service_is_an_error_result(scratch):
    target = f"127.0.0.1:{free_port()}"
    async with McpClient(stdio(target), mode="legacy") as mcp:
        r = await mcp.call_tool("kv_put", {"key": "x", "value": 1})
    assert r.is_error and text(r).startswith(f"The AgentTx service at {target} is unreachable")


# ---- streamable HTTP -----------------------------------------------------------------------

async def test_http_sessions_each_keep_their_own_transaction(http_url, svc, hooks, uniq):
    key = f"http-{uniq}"
    async with McpClient(http_url, mode="legacy") as one, \
            McpClient(http_url, mode="legacy") as two:
        assert {t.name for t in (await one.list_tools()).tools} >= {"kv_put", "agenttx_commit"}
        a = await one.call_tool("kv_put", {"key": f"a-{uniq}", "value": "one"})
        b = await two.call_tool("kv_put", {"key": f"b-{uniq}", "value": "two"})
        tx_a, tx_b = a.structured_content["transaction"], b.structured_content["transaction"]
        assert tx_a != tx_b
        failed = await one.call_tool("kv_get", {"key": f"missing-{uniq}"})
        assert failed.is_error and failed.structured_content["category"] == "no_data_found"
        assert f"missing-{uniq}" in failed.structured_content["hint"]
        assert failed.structured_content["transaction"] == tx_a
        await one.call_tool("effect_stage", {"channel": "hooks", "idempotency_key": key})
        assert (await two.call_tool("kv_get", {"key": f"b-{uniq}"})).structured_content[
            "step_id"] == 2
        assert text(await one.call_tool("agenttx_commit", {})) == \
            f"Committed transaction {tx_a}: 2 steps, 1 effect delivered."
        assert _keys(hooks, key) == 1
        assert text(await two.call_tool("agenttx_rollback", {})).startswith(
            f"Aborted transaction {tx_b}")
    with Client(svc.target) as client:
        with client.transaction() as tx:
            assert tx.step("kv.get", {"key": f"a-{uniq}"}).output["value"] == "one"
            assert not tx.step("kv.get", {"key": f"b-{uniq}"}).ok
            tx.rollback()


async def test_http_under_the_stateless_revision_uses_handles(http_url, uniq):
    async with McpClient(http_url, mode=MODERN) as mcp:
        tx = (await mcp.call_tool("agenttx_begin", {})).structured_content["transaction"]
        r = await mcp.call_tool("kv_put", {"key": f"s-{uniq}", "value": 1, "transaction": tx})
        assert (r.is_error, r.structured_content["step_id"]) == (False, 1)
        done = await mcp.call_tool("agenttx_commit", {"transaction": tx})
        assert text(done) == f"Committed transaction {tx}: 1 step, 0 effects delivered."


async def test_sigterm_aborts_the_open_transactions_of_http_sessions(svc, scratch, sandbox, uniq):
    proc, url = _http_server(svc.target, scratch / f"mcp-http-{uniq}.log")
    path = sandbox / f"http-open-{uniq}.txt"
    mcp = McpClient(url, mode="legacy")
    try:
        await mcp.__aenter__()
        r = await mcp.call_tool("fs_write", {"path": path.name, "contents": "uncommitted"})
        tx = r.structured_content["transaction"]
        assert path.exists()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(Exception):  # the server is gone: closing may complain
            await mcp.__aexit__(None, None, None)
    assert not path.exists()
    with Client(svc.target) as client, pytest.raises(NotFound):
        client.get(tx)
    log = (scratch / f"mcp-http-{uniq}.log").read_text()
    assert "aborted an open transaction at shutdown" in log and tx in log


def test_sigterm_aborts_the_open_transaction_of_a_stdio_session(svc, sandbox, uniq):
    """Raw JSON-RPC lines over the pipes (the SDK client hides the process id)."""
    path = sandbox / f"stdio-sig-{uniq}.txt"
    proc = subprocess.Popen([sys.executable, "-m", "agenttx", "mcp", "--target", svc.target],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def send(message: dict[str, Any]) -> None:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "1"}}})
        assert json.loads(proc.stdout.readline())["result"]["serverInfo"]["name"] == "agenttx"
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "fs_write", "arguments": {"path": path.name, "contents": "uncommitted"}}})
        result = json.loads(proc.stdout.readline())["result"]
        tx = result["structuredContent"]["transaction"]
        assert result["isError"] is False and path.exists()
        proc.send_signal(signal.SIGTERM)  # stdin stays open: only the signal stops it
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not path.exists()
    with Client(svc.target) as client, pytest.raises(NotFound):
        client.get(tx)
    assert "aborted an open transaction at shutdown" in proc.stderr.read()
