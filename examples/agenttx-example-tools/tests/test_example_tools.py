"""The example tools, installed and used through a real `agenttx serve`.

One server process for the module, started the way a user would start it: no
--etcd-endpoints, so it runs its own embedded (real) etcd under --data-dir, and it loads
this package's tools from the `agenttx.tools` entry-point group of the environment it
runs in. Nothing is imported from the service's own test suite; the few helpers needed
are below. Run after `pip install -e examples/agenttx-example-tools`.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agenttx._proto import agenttx_pb2 as pb
from agenttx._proto import agenttx_pb2_grpc as pb_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    stub: pb_grpc.AgentTxServiceStub
    tickets: pathlib.Path
    log_path: pathlib.Path

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("agenttx-example")
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "AGENTTX_LOG_FORMAT": "json",
           "AGENTTX_EXAMPLE_TICKETS_DIR": str(root / "tickets")}
    log_path = root / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agenttx", "serve", "--listen", address,
             "--data-dir", str(root / "data"), "--fs-root", str(root / "sandbox"),
             "--grace-period-s", "2"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    channel = grpc.insecure_channel(address)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "agenttx serve did not become ready"
            time.sleep(0.1)
        yield Server(pb_grpc.AgentTxServiceStub(channel), root / "tickets", log_path)
    finally:
        channel.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Agent:
    """Keeps the next step id, like a real agent would."""

    def __init__(self, stub: pb_grpc.AgentTxServiceStub, **policy: Any) -> None:
        self.stub = stub
        req = pb.BeginTransactionRequest(agent_id="example-tools-test")
        if policy:
            req.policy.CopyFrom(pb.RollbackPolicy(**policy))
        resp = stub.BeginTransaction(req)
        self.tx, self.next = resp.transaction_id, resp.next_step_id

    def step(self, tool: str, args: Any) -> pb.ExecuteStepResponse:
        resp = self.stub.ExecuteStep(pb.ExecuteStepRequest(
            transaction_id=self.tx, step_id=self.next, tool_name=tool,
            arguments_json=json.dumps(args)))
        self.next = resp.next_step_id
        return resp

    def ok(self, tool: str, args: Any) -> Any:
        resp = self.step(tool, args)
        assert resp.status == pb.STEP_STATUS_SUCCESS, (resp.error_category, resp.clean_hint)
        return json.loads(resp.output_json)

    def commit(self) -> pb.CommitTransactionResponse:
        return self.stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=self.tx))

    def rollback(self, to_step: int | None = None) -> pb.RollbackTransactionResponse:
        req = pb.RollbackTransactionRequest(transaction_id=self.tx)
        if to_step is not None:
            req.to_step = to_step
        resp = self.stub.RollbackTransaction(req)
        self.next = resp.next_step_id
        return resp


def failed(resp: pb.ExecuteStepResponse, category: str, *fragments: str) -> str:
    assert resp.status != pb.STEP_STATUS_SUCCESS, resp.output_json
    assert resp.error_category == category, (resp.error_category, resp.clean_hint)
    for fragment in fragments:
        assert fragment in resp.clean_hint, (fragment, resp.clean_hint)
    return resp.clean_hint


def uniq() -> str:
    return os.urandom(5).hex()


# ---- the tools are loaded -------------------------------------------------------------------

def test_the_plugin_tools_are_loaded_and_suggested_for_typos(server: Server) -> None:
    loaded = {r.get("tool") for r in server.logs() if r.get("msg") == "loaded tool plug-in"}
    assert {"ticket.create", "counter.add", "notify.team"} <= loaded
    agent = Agent(server.stub)
    failed(agent.step("ticket.creat", {"id": "x", "title": "t"}), "undefined_function",
           '"ticket.create"')


# ---- ticket.create: SAGA ---------------------------------------------------------------------

def test_ticket_create_writes_now_and_its_compensation_removes_the_file(server: Server) -> None:
    tid = f"T-{uniq()}"
    ticket = server.tickets / f"{tid}.json"
    agent = Agent(server.stub)
    assert agent.ok("ticket.create", {"id": tid, "title": "printer on fire",
                                      "priority": "high"}) == \
        {"id": tid, "title": "printer on fire", "priority": "high"}
    assert json.loads(ticket.read_text())["transaction_id"] == agent.tx  # visible at once
    agent.ok("counter.add", {"key": f"tickets-{tid}"})
    resp = agent.rollback(to_step=1)
    assert (resp.rolled_back, resp.compensations_run, resp.next_step_id) == (True, 2, 1)
    assert not ticket.exists()
    # created again and committed: it stays
    agent.ok("ticket.create", {"id": tid, "title": "printer still on fire"})
    assert agent.commit().committed
    assert json.loads(ticket.read_text())["title"] == "printer still on fire"


def test_an_automatic_rollback_compensates_the_ticket(server: Server) -> None:
    tid = f"T-{uniq()}"
    ticket = server.tickets / f"{tid}.json"
    agent = Agent(server.stub, max_local_depth=0)
    agent.ok("ticket.create", {"id": tid, "title": "t"})
    resp = agent.step("kv.gett", {})  # no dependencies, depth 0: GLOBAL_RESET
    assert resp.strategy == pb.ROLLBACK_STRATEGY_GLOBAL_RESET, resp
    assert not ticket.exists()


def test_a_duplicate_ticket_is_cleaned_exactly_like_the_builtin_duplicate(server: Server) -> None:
    tid = f"T-{uniq()}"
    custom = Agent(server.stub)
    custom.ok("ticket.create", {"id": tid, "title": "first"})
    mine = custom.step("ticket.create", {"id": tid, "title": "second"})
    builtin = Agent(server.stub)
    builtin.ok("record.insert", {"table": "tickets", "id": tid})
    theirs = builtin.step("record.insert", {"table": "tickets", "id": tid})
    hint = failed(mine, "unique_violation", f'"{tid}"', '"tickets"')
    assert (theirs.error_category, theirs.clean_hint) == (mine.error_category, hint)
    assert list(mine.constraints) == [hint]
    assert mine.strategy == theirs.strategy == pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK
    custom.rollback()
    builtin.rollback()


@pytest.mark.parametrize(("tool", "args", "fragments"), [
    ("ticket.create", {"title": "t"}, ['"id" is missing']),
    ("ticket.create", {"id": "../etc", "title": "t"}, ['"id"', "../etc"]),
    ("ticket.create", {"id": 7, "title": "t"}, ['"id"', "wrong type", "string"]),
    ("ticket.create", {"id": "a", "title": "t", "priority": "urgent"},
     ['"urgent"', '"priority"', '"low"']),
    ("ticket.create", {"id": "a", "title": "t", "owner": "me"}, ['"owner"', '"title"']),
    ("counter.add", {"key": "k", "amount": "5"}, ['"amount"', "integer"]),
])
def test_argument_model_errors_read_like_the_builtins(server: Server, tool: str, args: Any,
                                                      fragments: list[str]) -> None:
    hint = failed(Agent(server.stub).step(tool, args), "invalid_parameter_value", *fragments)
    assert "\n" not in hint and len(hint) <= 200


# ---- counter.add: JOURNAL --------------------------------------------------------------------

def test_counter_add_buffers_its_writes_until_commit(server: Server) -> None:
    key = f"hits-{uniq()}"
    agent = Agent(server.stub)
    assert agent.ok("counter.add", {"key": key, "amount": 2})["value"] == 2
    assert agent.ok("counter.add", {"key": key, "amount": 3}) == \
        {"key": key, "value": 5, "previous": 2}
    failed(Agent(server.stub).step("kv.get", {"key": key}), "no_data_found", key)  # isolation
    assert agent.commit().committed
    assert Agent(server.stub).ok("kv.get", {"key": key})["value"] == 5


def test_a_bad_counter_value_escalates_to_the_step_that_wrote_it(server: Server) -> None:
    key = f"hits-{uniq()}"
    agent = Agent(server.stub, max_local_depth=1)
    agent.ok("kv.put", {"key": key, "value": "many"})
    agent.ok("kv.put", {"key": f"other-{uniq()}", "value": 1})
    first = agent.step("counter.add", {"key": key})
    failed(first, "invalid_text_representation", '"many"', "integer")
    assert first.strategy == pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK
    again = agent.step("counter.add", {"key": key})
    assert again.strategy == pb.ROLLBACK_STRATEGY_DEPENDENCY_JUMP
    assert (again.rollback_to_step, again.next_step_id) == (1, 1)


# ---- notify.team: EFFECT ---------------------------------------------------------------------

def effect_logged(server: Server, message: str) -> bool:
    return any(r.get("msg") == "effect" and (r.get("payload") or {}).get("message") == message
               for r in server.logs())


def test_notify_team_is_sent_after_commit_and_never_after_rollback(server: Server) -> None:
    dropped, sent = f"dropped {uniq()}", f"sent {uniq()}"
    agent = Agent(server.stub)
    out = agent.ok("notify.team", {"team": "oncall", "message": dropped})
    assert out["staged"] is True and out["channel"] == "log" and out["idempotency_key"]
    agent.rollback()

    agent = Agent(server.stub)
    agent.ok("notify.team", {"team": "oncall", "message": sent})
    resp = agent.commit()
    assert (resp.committed, resp.effects_dispatched) == (True, 1), resp
    deadline = time.monotonic() + 10
    while not effect_logged(server, sent):
        assert time.monotonic() < deadline, "the committed effect was not delivered"
        time.sleep(0.1)
    assert not effect_logged(server, dropped)


def test_notify_team_on_an_unknown_channel_fails_the_step(server: Server) -> None:
    resp = Agent(server.stub).step("notify.team", {"team": "oncall", "message": "m",
                                                   "channel": "pager"})
    failed(resp, "undefined_object", '"pager"', '"log"')
