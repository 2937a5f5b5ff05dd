"""`agenttx mcp` driven by the `mcp` SDK's own client, over stdio and streamable HTTP.

A real `agenttx mcp` process in front of a real replica (real etcd): the tool list with
typed schemas, output schemas and truthful annotations; a transaction with a failing step
whose result carries the hint (in the names the model calls), category, strategy and next
step as text and as `structuredContent`; commit delivering an effect to a loopback
webhook; per-session state (`Mcp-Session-Id`) and handles under the stateless revision,
where a call without a handle is an error and begins nothing; a session that closes
(stdio's end, HTTP DELETE, a client gone without DELETE) rolling its transaction back at
once; bearer authentication forwarded to a token-mode service; no HTTP off loopback
without it.

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
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agenttx.auth import hash_token
from agenttx.client import Client, NotFound
from agenttx.embedded_etcd import free_port
from agenttx.mcp_server.bridge import CLOSED_REASON, NO_HANDLE
from agenttx.mcp_server.catalog import CONTROL_TOOLS, HANDLE_SCHEMA, STEP_OUTPUT_SCHEMA, mcp_name
from agenttx.testing import ServiceProcess
from agenttx.tools.registry import ToolRegistry
from agenttx.tools.schema import input_schema
from support.receivers import WebhookReceiver
from support.waiting import eventually, slack

MODERN = "2026-07-28"


def _committed(client: Client, key: str) -> Any:
    tx = client.begin()
    r = tx.step("kv.get", {"key": key})
    tx.rollback()
    return r.output["value"] if r.ok else None


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


def _http_server(target: str, log_path: Any, *extra: str, env: dict[str, str] | None = None,
                 agent_id: str = "mcp-http") -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenttx", "mcp", "--transport", "http", "--listen",
             f"127.0.0.1:{port}", "--agent-id", agent_id, *extra],
            env={**os.environ, "AGENTTX_TARGET": target, **(env or {})}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def accepting() -> bool:
        assert proc.poll() is None, open(log_path).read()[-3000:]
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    eventually(accepting, slack(20), "agenttx mcp --transport http listening")
    return proc, f"http://127.0.0.1:{port}/mcp"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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
        assert (s["transaction"], s["step_id"], s["category"], s["strategy"], s["next_step"],
                s["ok"], s["output"], s["rollback_to_step"]) \
            == (tx, 2, "foreign_key_violation", "LOCAL_BACKTRACK", 2, False, None, 2)
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
        assert abort.is_error and abort.structured_content["next_step"] == 0
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
        done = await mcp.call_tool("agenttx_commit", {"transaction": tx})
        assert text(done) == f"Committed transaction {tx}: 2 steps, 0 effects delivered."
        gone = await mcp.call_tool("kv_get", {"key": f"h-{uniq}", "transaction": tx})
        assert gone.is_error and text(gone).startswith("The transaction no longer exists")
        assert text(gone).endswith("Call agenttx_begin for a new one.")


async def test_without_a_session_a_call_without_a_handle_is_an_error_and_begins_nothing(
        svc, uniq):
    agent = f"mcp-nohandle-{uniq}"
    async with McpClient(stdio(svc.target, agent), mode=MODERN) as mcp:
        for name, args in (("kv_put", {"key": f"n-{uniq}", "value": 1}),
                           ("agenttx_commit", {}), ("agenttx_rollback", {}),
                           ("agenttx_status", {})):
            r = await mcp.call_tool(name, args)
            assert (r.is_error, text(r)) == (True, NO_HANDLE), name
    with Client(svc.target) as client:
        assert list(client.list_transactions(agent_id_prefix=agent)) == []


async def test_closing_a_stdio_session_rolls_back_its_transaction_at_once(svc, sandbox, uniq):
    path = sandbox / f"left-open-{uniq}.txt"
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        await mcp.call_tool("kv_put", {"key": f"stdio-{uniq}", "value": 1})
        r = await mcp.call_tool("fs_write", {"path": path.name, "contents": "uncommitted"})
        tx = r.structured_content["transaction"]
        assert path.read_text() == "uncommitted"
    # stdin's end closed the session: rolled back before the server exited
    with Client(svc.target) as client:
        history = client.history(tx)
        with pytest.raises(NotFound):
            client.get(tx)
        assert _committed(client, f"stdio-{uniq}") is None
    assert (history.status.value, history.reason) == ("ABORTED", CLOSED_REASON)
    assert not path.exists()


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
    assert "rolled back the transaction of a closed MCP session" in log and tx in log


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


# ---- typed arguments, structured results, the model's words ---------------------------------

async def test_step_tools_declare_an_output_schema_and_return_structured_content(svc, uniq):
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert {n for n, t in tools.items() if t.output_schema == STEP_OUTPUT_SCHEMA} == \
            set(tools) - set(CONTROL_TOOLS)
        # the SDK client checks every non-error result against the declared schema
        ok = await mcp.call_tool("kv_put", {"key": f"o-{uniq}", "value": {"a": [1]}})
        s = ok.structured_content
        assert (s["ok"], s["output"], s["category"], s["hint"], s["strategy"], s["next_step"],
                s["rollback_to_step"], s["step_id"]) == \
            (True, {"key": f"o-{uniq}", "value": {"a": [1]}}, "", "", "NONE", 2, 0, 1)
        await mcp.call_tool("agenttx_rollback", {})


async def test_a_generic_clients_typed_values_keep_their_json_types(svc, uniq):
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert tools["kv_put"].input_schema["properties"]["value"]["type"] == \
            ["string", "number", "integer", "boolean", "object", "array", "null"]
        assert tools["record_insert"].input_schema["properties"]["fields"]["type"] == "object"
        assert tools["record_insert"].input_schema["properties"]["id"]["type"] == \
            ["string", "number"]
        put = await mcp.call_tool("kv_put", {"key": f"n-{uniq}", "value": 42})
        row = await mcp.call_tool("record_insert", {"table": f"typed_{uniq}", "id": 7,
                                                    "fields": {"qty": 3, "tags": ["a"]}})
        assert not put.is_error and not row.is_error, (text(put), text(row))
        assert text(await mcp.call_tool("agenttx_commit", {})).startswith("Committed")
    with Client(svc.target) as client:
        value = _committed(client, f"n-{uniq}")
        assert value == 42 and type(value) is int  # a number, not "42"
        tx = client.begin()
        got = tx.step("record.get", {"table": f"typed_{uniq}", "id": 7})
        tx.rollback()
        assert got.output == {"table": f"typed_{uniq}", "id": 7,
                              "fields": {"qty": 3, "tags": ["a"]}}


async def test_hints_name_the_tools_and_arguments_the_model_sees(svc, uniq):
    async with McpClient(stdio(svc.target), mode="legacy") as mcp:
        missing = await mcp.call_tool("kv_get", {"key": f"nothing-{uniq}"})
        assert missing.structured_content["hint"] == \
            f'Key "nothing-{uniq}" does not exist in kv; kv_put it first or read an existing key.'
        assert f"Hint: {missing.structured_content['hint']}" in text(missing)
        wrong = await mcp.call_tool("record_insert", {"table": "t", "id": 1,
                                                      "fields": "not an object"})
        hint = wrong.structured_content["hint"]
        assert hint.endswith("send an object instead.") and "map" not in hint, hint
        for r in (missing, wrong):
            assert "arguments_json" not in text(r) and "kv.put" not in text(r)
        await mcp.call_tool("agenttx_rollback", {})


# ---- sessions that close ------------------------------------------------------------------

async def test_deleting_an_http_session_rolls_back_its_transaction_at_once(http_url, svc,
                                                                          sandbox, uniq):
    path = sandbox / f"http-delete-{uniq}.txt"
    async with McpClient(http_url, mode="legacy") as mcp:  # leaving sends DELETE
        await mcp.call_tool("kv_put", {"key": f"del-{uniq}", "value": 1})
        r = await mcp.call_tool("fs_write", {"path": path.name, "contents": "uncommitted"})
        tx = r.structured_content["transaction"]
        assert path.exists()
    with Client(svc.target) as client:
        # the DELETE was answered after the rollback: no waiting needed
        history = client.history(tx)
        assert (history.status.value, history.reason) == ("ABORTED", CLOSED_REASON)
        assert _committed(client, f"del-{uniq}") is None
    assert not path.exists()


async def test_a_client_gone_without_delete_is_rolled_back_when_its_session_idles_out(
        svc, scratch, uniq):
    idle = 2.0
    proc, url = _http_server(svc.target, scratch / f"mcp-idle-{uniq}.log",
                             "--session-idle-timeout-s", str(idle))
    try:
        transport = streamable_http_client(url, terminate_on_close=False)
        async with McpClient(transport, mode="legacy") as mcp:
            r = await mcp.call_tool("kv_put", {"key": f"gone-{uniq}", "value": 1})
            tx = r.structured_content["transaction"]
        # no DELETE was sent: the session ends once it idled out
        with Client(svc.target) as client:
            def rolled_back() -> Any:
                history = client.history(tx)
                return history.ended and history
            history = await asyncio.to_thread(eventually, rolled_back, slack(idle + 1),
                                              "the idle session's transaction rolled back")
            assert (history.status.value, history.reason) == ("ABORTED", CLOSED_REASON)
    finally:
        _stop(proc)


async def test_http_without_a_session_needs_the_handle_and_begins_nothing(svc, scratch, uniq):
    agent = f"mcp-http-stateless-{uniq}"
    proc, url = _http_server(svc.target, scratch / f"mcp-stateless-{uniq}.log", agent_id=agent)
    try:
        async with McpClient(url, mode=MODERN) as mcp:
            r = await mcp.call_tool("kv_put", {"key": f"sl-{uniq}", "value": 1})
            assert (r.is_error, text(r)) == (True, NO_HANDLE)
        with Client(svc.target) as client:
            assert list(client.list_transactions(agent_id_prefix=agent)) == []
    finally:
        _stop(proc)


# ---- authentication -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def token_svc(etcd, scratch, sandbox) -> Iterator[ServiceProcess]:
    tokens = scratch / f"mcp-tokens-{uuid.uuid4().hex[:6]}.json"
    tokens.write_text(json.dumps({"tokens": [
        {"sha256": hash_token("alice-t0ken"), "principal": "alice", "roles": ["agent"]},
        {"sha256": hash_token("ops-t0ken"), "principal": "ops", "roles": ["admin"]}]}))
    proc = ServiceProcess("mcp-token", etcd_endpoints=etcd.endpoints,
                          prefix=f"/agenttx-mcptok-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                          workdir=scratch / "mcp-token",
                          extra_args=["--auth", "token", "--auth-tokens-file", str(tokens)]).start()
    yield proc
    proc.stop()


async def test_require_auth_answers_401_without_a_token_and_forwards_the_callers_token(
        token_svc, scratch, uniq):
    proc, url = _http_server(token_svc.target, scratch / f"mcp-auth-{uniq}.log",
                             "--require-auth")
    try:
        async with httpx2.AsyncClient() as http:
            refused = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                      headers={"Accept": "application/json, text/event-stream"})
        assert (refused.status_code, refused.headers["www-authenticate"]) == (401, "Bearer")
        assert refused.json()["error"]["message"] == (
            "missing credentials: send 'Authorization: Bearer <token>' with every request")

        alice = httpx2.AsyncClient(headers={"Authorization": "Bearer alice-t0ken"})
        async with alice, McpClient(streamable_http_client(url, http_client=alice),
                                    mode="legacy") as mcp:
            r = await mcp.call_tool("kv_put", {"key": f"auth-{uniq}", "value": 1})
            assert not r.is_error, text(r)
            tx = r.structured_content["transaction"]
            await mcp.call_tool("agenttx_commit", {})
        with Client(token_svc.target, token="ops-t0ken") as ops:
            history = ops.history(tx)
        assert (history.principal, history.status.value) == ("alice", "COMMITTED")

        wrong = httpx2.AsyncClient(headers={"Authorization": "Bearer not-a-token"})
        async with wrong, McpClient(streamable_http_client(url, http_client=wrong),
                                    mode="legacy") as mcp:
            r = await mcp.call_tool("kv_put", {"key": f"auth2-{uniq}", "value": 1})
            assert r.is_error and text(r) == \
                "AgentTx refused the call: UNAUTHENTICATED: invalid credentials"
    finally:
        _stop(proc)


@pytest.mark.parametrize(("args", "message"), [
    (("--transport", "http", "--listen", "0.0.0.0:8000"),
     "agenttx mcp: --listen 0.0.0.0:8000 is not a loopback address: add --require-auth, so "
     "every request carries its caller's own bearer token\n"),
    (("--require-auth",),
     "agenttx mcp: --require-auth applies to --transport http (over stdio the credentials "
     "are --token / AGENTTX_TOKEN)\n"),
])
def test_http_off_loopback_without_require_auth_refuses_to_start(args, message):
    run = subprocess.run([sys.executable, "-m", "agenttx", "mcp", *args], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (run.returncode, run.stdout, run.stderr) == (2, "", message)
