"""Toolsets (docs/toolsets.md): the tools of real MCP servers (the official SDK, on
loopback: tests/support/mcp_upstreams.py) join transactions run by two real replicas on
a real etcd, declared with `--toolsets-file`.

What a user would notice is asserted where they would notice it: the step answers, the
upstream's own call log (which tool, which arguments, which idempotency key, which
headers), the tracker's tickets, etcd, and the replicas' logs. Every rollback path calls
a saga's compensation exactly once with its resolved arguments; a deferred call is made
once after commit and never after a rollback, abort or conflict.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agenttx.client import Client
from agenttx.config import Settings
from agenttx.contracts.layout import Keys
from agenttx.embedded_etcd import free_port
from agenttx.observability import tracing
from agenttx.server import serve
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from support.mcp_upstreams import Upstreams, declaration, mailer, ticket, tracker
from support.rpc import ended, expect_error, expect_failure, get, output
from support.service import Agent, ServiceProcess
from support.waiting import eventually, eventually_async, slack

TIMEOUT_S = 2.0          # the toolsets' timeoutSeconds
POLL_S = 0.2             # the replicas' --effect-poll-s


@dataclass
class Secrets:
    file: Path
    file_value: str
    literal: str


@dataclass
class Cluster:
    a: ServiceProcess
    b: ServiceProcess
    prefix: str
    file: Path

    @property
    def keys(self) -> Keys:
        return Keys(self.prefix)


@pytest.fixture(scope="module")
def ups() -> Iterator[Upstreams]:
    with tracker() as t, mailer() as m:
        yield Upstreams(t, m)


@pytest.fixture(scope="module")
def secrets(scratch) -> Secrets:
    folder = scratch / "toolset-secrets"
    folder.mkdir(parents=True, exist_ok=True)
    value = f"Bearer from-a-file-{uuid.uuid4().hex}"
    path = folder / "tracker-token"
    path.write_text(value + "\n")
    return Secrets(path, value, f"literal-{uuid.uuid4().hex}")


@pytest.fixture(scope="module")
def cluster(etcd, scratch, sandbox, ups, secrets) -> Iterator[Cluster]:
    prefix = f"/agenttx-ts-{uuid.uuid4().hex[:8]}"
    path = scratch / f"toolsets-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(declaration(ups, timeout_s=TIMEOUT_S, headers=[
        {"name": "Authorization", "file": str(secrets.file)},
        {"name": "X-Api-Key", "value": secrets.literal}])))
    procs = [ServiceProcess(name, etcd_endpoints=etcd.endpoints, prefix=prefix,
                            fs_root=str(sandbox), workdir=scratch / "toolsets",
                            env={"AGENTTX_MAX_OPEN_TRANSACTIONS": "100000",
                                 "AGENTTX_EFFECT_POLL_S": str(POLL_S)},
                            extra_args=["--toolsets-file", str(path)])
             for name in ("toolsets-a", "toolsets-b")]
    for p in procs:
        p.start()
    yield Cluster(procs[0], procs[1], prefix, path)
    for p in procs:
        p.stop()


def title(what: str) -> str:
    return f"{what} {uuid.uuid4().hex[:8]}"


def created(agent: Agent, what: str, **kw) -> dict:
    return agent.ok("tickets.create_ticket", {"title": title(what), **kw})


# ---- the three kinds -----------------------------------------------------------------------

def test_a_read_step_returns_the_upstreams_structured_content_keyed_by_its_step(cluster, ups):
    agent = Agent(cluster.a.stub)
    made = created(agent, "readable")
    found = agent.step("tickets.search_tickets", {"query": made["title"]})
    assert output(found) == {"tickets": [made]}
    [call] = ups.tracker.calls_to("search_tickets", query=made["title"])
    assert call.key is not None and call.key.startswith(f"{agent.tx}/2/")
    assert agent.commit().committed
    assert ups.tracker.calls_to("close_ticket", id=made["id"]) == []  # nothing undone


def test_a_result_without_structured_content_is_its_text(cluster, ups):
    agent = Agent(cluster.b.stub)
    out = agent.ok("tickets.tracker_status", {})
    opened = sum(1 for t in ups.tracker.state["tickets"].values() if t["status"] == "open")
    assert out == {"text": f"{opened} open tickets"}


def test_an_answer_too_large_to_be_an_output_is_refused_unread(cluster, ups):
    agent = Agent(cluster.b.stub)
    ups.tracker.control.padding = 9 * 1024 * 1024
    try:
        resp = agent.step("tickets.tracker_status", {})
    finally:
        ups.tracker.control.padding = 0
    expect_failure(resp, "fdw_error", "with more than 8 MiB")


def test_a_saga_step_acts_at_once_and_is_undone_once_by_rollback_to_step(cluster, ups):
    agent = Agent(cluster.a.stub)
    made = created(agent, "undo me")
    assert ticket(ups.tracker, made["id"])["status"] == "open"      # acted at step time
    [create] = ups.tracker.calls_to("create_ticket", title=made["title"])
    assert create.key is not None and create.key.startswith(f"{agent.tx}/1/")
    resp = agent.rollback(to_step=1, reason="test")
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run,
            list(resp.compensation_errors)) == (True, 1, 1, [])
    [close] = ups.tracker.calls_to("close_ticket", id=made["id"])
    assert close.arguments == {"id": made["id"], "reason": "rolled back by AgentTx"}
    assert close.key == f"{create.key}/undo"
    assert ticket(ups.tracker, made["id"])["status"] == "closed"


def test_an_abort_undoes_every_saga_step_once_newest_first(cluster, ups):
    agent = Agent(cluster.a.stub)
    made = created(agent, "abort me")
    agent.ok("tickets.add_comment", {"id": made["id"], "text": "first"})
    assert agent.rollback().rolled_back
    [delete] = ups.tracker.calls_to("delete_comment", id=made["id"])
    [close] = ups.tracker.calls_to("close_ticket", id=made["id"])
    assert delete.arguments == {"id": made["id"], "text": "first"}   # from the arguments
    assert delete.at <= close.at
    assert ticket(ups.tracker, made["id"])["comments"] == []
    expect_error(cluster.a.stub.GetTransaction,
                 pb.GetTransactionRequest(transaction_id=agent.tx), grpc.StatusCode.NOT_FOUND)


def test_a_dependency_jump_after_a_later_failure_closes_the_ticket_once(cluster, ups):
    agent = Agent(cluster.b.stub)
    made = created(agent, "culprit")
    agent.ok("kv.put", {"key": f"note-{uuid.uuid4().hex}", "value": 1})
    # step 3 reads a key named by step 1's output: missing -> step 1 is the culprit
    resp = agent.step("kv.get", {"key": "${steps.1.id}"})
    expect_failure(resp, "no_data_found", made["id"])
    assert (resp.strategy, resp.rollback_to_step, resp.next_step_id) == \
        (pb.ROLLBACK_STRATEGY_DEPENDENCY_JUMP, 1, 1)
    [close] = ups.tracker.calls_to("close_ticket", id=made["id"])
    assert close.arguments == {"id": made["id"], "reason": "rolled back by AgentTx"}


def test_a_global_reset_closes_the_ticket_once(cluster, ups):
    agent = Agent(cluster.a.stub, max_local_depth=0, max_global_resets=1)
    made = created(agent, "reset")
    resp = agent.step("kv.get", {"key": f"never-{uuid.uuid4().hex}"})
    assert (resp.strategy, resp.next_step_id, resp.context_reset) == \
        (pb.ROLLBACK_STRATEGY_GLOBAL_RESET, 1, True)
    assert len(ups.tracker.calls_to("close_ticket", id=made["id"])) == 1


def test_a_commit_conflict_closes_the_ticket_once(cluster, ups):
    key = f"contended-{uuid.uuid4().hex}"
    loser = Agent(cluster.a.stub)
    made = created(loser, "conflict")
    loser.ok("kv.put", {"key": key, "value": "loser"})
    winner = Agent(cluster.b.stub)
    winner.ok("kv.put", {"key": key, "value": "winner"})
    assert winner.commit().committed
    expect_error(cluster.a.stub.CommitTransaction,
                 pb.CommitTransactionRequest(transaction_id=loser.tx), grpc.StatusCode.ABORTED,
                 "conflict")
    [close] = ups.tracker.calls_to("close_ticket", id=made["id"])
    assert close.arguments["id"] == made["id"]
    assert ticket(ups.tracker, made["id"])["status"] == "closed"


IDLE_S = 2
REAPER_PASS_S = 5.0     # the reaper's interval on replicas whose own idle timeout is 900 s


async def test_the_reaper_closes_an_idle_transactions_ticket_once_and_never_sends_its_mail(
        cluster, ups, etcd, scratch, sandbox, store):
    short = ServiceProcess("toolsets-short-idle", etcd_endpoints=etcd.endpoints,
                           prefix=cluster.prefix, fs_root=str(sandbox),
                           workdir=scratch / "toolsets",
                           extra_args=["--toolsets-file", str(cluster.file),
                                       "--tx-idle-timeout-s", str(IDLE_S)]).start()
    try:
        agent = Agent(short.stub)        # its policy: idle after IDLE_S
        made = created(agent, "idle")
        subject = title("never after reaping")
        agent.ok("mail.send_email", {"to": "x@example.com", "subject": subject})
        eventually(lambda: ups.tracker.calls_to("close_ticket", id=made["id"]),
                   slack(IDLE_S + REAPER_PASS_S), "the reaper's compensation")
    finally:
        short.stop()
    eventually(lambda: ended(cluster.a.stub, agent.tx), slack(REAPER_PASS_S),
               "the idle transaction ended")
    assert await _outbox(store, cluster, agent.tx) == []       # the mail can never be sent
    assert len(ups.tracker.calls_to("close_ticket", id=made["id"])) == 1
    assert ups.mailer.calls_to("send_email", subject=subject) == []


async def _outbox(store, cluster: Cluster, tx: str) -> list:
    """The transaction's outbox entries: what is still to be delivered, ever."""
    return await store.get_prefix(cluster.keys.outbox_prefix() + f"{tx}/".encode())




async def test_a_deferred_call_is_made_once_after_commit_with_its_staged_key(cluster, ups,
                                                                            store):
    agent = Agent(cluster.a.stub)
    subject = title("weekly report")
    staged = agent.ok("mail.send_email", {"to": "team@example.com", "subject": subject})
    assert staged["deferred"] is True and staged["tool"] == "mail.send_email"
    key = staged["idempotency_key"]
    assert ups.mailer.calls_to("send_email", subject=subject) == []   # not at step time
    commit = agent.commit()
    assert (commit.committed, commit.effects_dispatched, list(commit.dispatch_errors)) == \
        (True, 1, [])
    [sent] = ups.mailer.calls_to("send_email", subject=subject)
    assert sent.key == key
    assert sent.arguments == {"to": "team@example.com", "subject": subject, "body": ""}
    assert await _outbox(store, cluster, agent.tx) == []   # retired: never sent again


async def test_a_deferred_call_is_never_made_after_a_rollback_an_abort_or_a_conflict(
        cluster, ups, store):
    subjects = [title("never") for _ in range(3)]
    rolled = Agent(cluster.a.stub)
    rolled.ok("kv.put", {"key": f"k-{uuid.uuid4().hex}", "value": 1})
    rolled.ok("mail.send_email", {"to": "x@example.com", "subject": subjects[0]})
    assert rolled.rollback(to_step=2).rolled_back
    assert rolled.commit().committed
    aborted = Agent(cluster.b.stub)
    aborted.ok("mail.send_email", {"to": "x@example.com", "subject": subjects[1]})
    assert aborted.rollback().rolled_back
    key = f"contended-{uuid.uuid4().hex}"
    loser = Agent(cluster.a.stub)
    loser.ok("kv.put", {"key": key, "value": 1})
    loser.ok("mail.send_email", {"to": "x@example.com", "subject": subjects[2]})
    winner = Agent(cluster.b.stub)
    winner.ok("kv.put", {"key": key, "value": 2})
    assert winner.commit().committed
    expect_error(cluster.a.stub.CommitTransaction,
                 pb.CommitTransactionRequest(transaction_id=loser.tx), grpc.StatusCode.ABORTED)
    for tx in (rolled.tx, aborted.tx, loser.tx):      # nothing left that could be sent
        assert await _outbox(store, cluster, tx) == []
    assert [c for c in ups.mailer.calls if c.arguments.get("subject") in subjects] == []


async def test_a_deferred_call_to_an_upstream_that_is_down_is_retried_until_it_is_back(
        cluster, ups, store):
    agent = Agent(cluster.a.stub)
    subject = title("retried")
    key = agent.ok("mail.send_email", {"to": "x@example.com",
                                       "subject": subject})["idempotency_key"]
    ups.mailer.down()
    try:
        commit = agent.commit()
        assert commit.committed and commit.effects_dispatched == 0
        [error] = commit.dispatch_errors
        assert "refused the connection" in error
        assert len(await _outbox(store, cluster, agent.tx)) == 1      # kept, to be retried
    finally:
        ups.mailer.up()
    eventually(lambda: ups.mailer.calls_to("send_email", subject=subject),
               slack(POLL_S + 1), "the retried call made once the mailer is back")
    async def retired() -> bool:
        return await _outbox(store, cluster, agent.tx) == []
    await eventually_async(retired, slack(POLL_S + 1), "its outbox entry retired")
    [sent] = ups.mailer.calls_to("send_email", subject=subject)
    assert sent.key == key


def test_a_deferred_call_the_upstream_refuses_becomes_a_dead_letter_and_a_retry_sends_it(
        cluster, ups):
    agent = Agent(cluster.a.stub)
    subject = title("refused")
    key = agent.ok("mail.send_email", {"to": "x@example.com",
                                       "subject": subject})["idempotency_key"]
    ups.mailer.control.fail["send_email"] = "mailbox x@example.com does not exist"
    try:
        commit = agent.commit()
        assert commit.committed and commit.effects_dispatched == 0
        [error] = commit.dispatch_errors
        assert "mailbox x@example.com does not exist" in error and "dead letters" in error
        with Client(cluster.b.target) as client:
            [letter] = [d for d in client.dead_letters() if d.idempotency_key == key]
        assert (letter.kind, letter.channel, letter.attempts, letter.transaction_id) == \
            ("deferred", "mail.send_email", 1, agent.tx)
        assert "does not exist" in letter.last_error
        assert len(ups.mailer.calls_to("send_email", subject=subject)) == 1   # not retried
    finally:
        ups.mailer.control.fail.clear()
    with Client(cluster.b.target) as client:
        client.retry_dead_letter(key, reason="mailbox created")
    sent = eventually(lambda: len(ups.mailer.calls_to("send_email", subject=subject)) == 2,
                      slack(POLL_S * 2), "the retried call made")
    assert sent and {c.key for c in ups.mailer.calls_to("send_email", subject=subject)} == {key}


# ---- errors --------------------------------------------------------------------------------

def test_an_upstream_is_error_is_fdw_error_with_its_message_on_one_line(cluster, ups):
    ups.tracker.control.fail["create_ticket"] = "project OPS is archived\n  ask an admin"
    try:
        agent = Agent(cluster.a.stub)
        resp = agent.step("tickets.create_ticket", {"title": title("refused")})
    finally:
        ups.tracker.control.fail.pop("create_ticket")
    hint = expect_failure(resp, "fdw_error", "project OPS is archived ask an admin")
    assert resp.strategy == pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK and resp.next_step_id == 1
    assert hint.endswith("project OPS is archived ask an admin")
    # a refused call changed nothing: the retry is step 1 again and succeeds
    assert created(agent, "accepted")["status"] == "open"


def test_http_4xx_is_fdw_error_and_5xx_cannot_establish_a_connection(cluster, ups):
    agent = Agent(cluster.a.stub)
    for status, category in ((400, "fdw_error"), (503, "fdw_unable_to_establish_connection"),
                             (429, "fdw_unable_to_establish_connection")):
        ups.tracker.control.http_status = status
        try:
            resp = agent.step("tickets.search_tickets", {"query": "x"})
        finally:
            ups.tracker.control.http_status = None
        expect_failure(resp, category, f"HTTP {status}")


def test_an_upstream_that_is_down_cannot_be_reached_and_the_retry_succeeds_once_it_is_back(
        cluster, ups):
    agent = Agent(cluster.b.stub)
    ups.tracker.down()
    try:
        resp = agent.step("tickets.search_tickets", {"query": "anything"})
    finally:
        ups.tracker.up()
    expect_failure(resp, "fdw_unable_to_establish_connection", "refused the connection")
    assert (resp.strategy, resp.next_step_id) == (pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK, 1)
    assert output(agent.step("tickets.search_tickets", {"query": "anything"})) is not None


def test_a_slow_upstream_times_out_as_unable_to_establish_a_connection(cluster, ups):
    agent = Agent(cluster.a.stub)
    ups.tracker.control.stall_s["search_tickets"] = TIMEOUT_S * 3
    started = time.monotonic()
    try:
        resp = agent.step("tickets.search_tickets", {"query": "slow"})
    finally:
        ups.tracker.control.stall_s.clear()
    elapsed = time.monotonic() - started
    expect_failure(resp, "fdw_unable_to_establish_connection", f"within {TIMEOUT_S:g}s")
    assert TIMEOUT_S <= elapsed < TIMEOUT_S * 3
    assert resp.strategy == pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK


def test_a_timed_out_saga_call_compensated_from_its_arguments_fails_the_step(cluster, ups):
    agent = Agent(cluster.a.stub)
    made = created(agent, "slow comment")
    ups.tracker.control.stall_s["add_comment"] = TIMEOUT_S * 2
    try:
        resp = agent.step("tickets.add_comment", {"id": made["id"], "text": "late"})
    finally:
        ups.tracker.control.stall_s.clear()
    expect_failure(resp, "fdw_unable_to_establish_connection")
    assert (resp.strategy, resp.next_step_id) == (pb.ROLLBACK_STRATEGY_LOCAL_BACKTRACK, 2)
    # the call may have acted: its compensation ran once, from the arguments
    [delete] = ups.tracker.calls_to("delete_comment", id=made["id"])
    assert delete.arguments == {"id": made["id"], "text": "late"}
    eventually(lambda: ticket(ups.tracker, made["id"])["comments"] == [],
               slack(TIMEOUT_S * 2), "the late comment removed")
    assert get(cluster.b.stub, agent.tx).status == pb.TRANSACTION_STATUS_ACTIVE


def test_a_timed_out_saga_call_whose_undo_needs_its_output_waits_for_a_person(cluster, ups):
    agent = Agent(cluster.a.stub)
    name = title("unknowable")
    closes_before = len(ups.tracker.calls_to("close_ticket"))
    ups.tracker.control.stall_s["create_ticket"] = TIMEOUT_S * 2
    try:
        resp = agent.step("tickets.create_ticket", {"title": name})
    finally:
        ups.tracker.control.stall_s.clear()
    assert resp.strategy == pb.ROLLBACK_STRATEGY_MANUAL
    assert resp.error_category == "fdw_unable_to_establish_connection"
    [error] = resp.compensation_errors
    [call] = ups.tracker.calls_to("create_ticket", title=name)
    assert "tickets.create_ticket" in error and f'"title": "{name}"' in error
    assert call.key in error and "close_ticket" in error
    view = get(cluster.b.stub, agent.tx)
    assert view.status == pb.TRANSACTION_STATUS_AWAITING_ROLLBACK
    expect_error(cluster.b.stub.ExecuteStep, pb.ExecuteStepRequest(
        transaction_id=agent.tx, step_id=1, tool_name="kv.put", arguments_json='{"key":"x"}'),
        grpc.StatusCode.FAILED_PRECONDITION, "manual rollback")
    # the agent was told; RollbackTransaction to the step in flight releases the call
    # (a person checked the tracker) and the transaction goes on from there
    resp = agent.rollback(to_step=1)
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 1, 0)
    assert get(cluster.a.stub, agent.tx).status == pb.TRANSACTION_STATUS_ACTIVE
    # AgentTx never guessed an id to close: no compensation was attempted
    assert len(ups.tracker.calls_to("close_ticket")) == closes_before
    assert created(agent, "next")["status"] == "open"


def test_a_failed_compensation_goes_manual_naming_the_call_and_a_later_rollback_retries_it(
        cluster, ups):
    agent = Agent(cluster.a.stub)
    made = created(agent, "stubborn")
    ups.tracker.control.fail["close_ticket"] = "tracker is read-only"
    try:
        first = agent.rollback(to_step=1)
    finally:
        ups.tracker.control.fail.clear()
    assert (first.rolled_back, first.next_step_id) == (False, 2)
    [error] = first.compensation_errors
    [create] = ups.tracker.calls_to("create_ticket", title=made["title"])
    for fragment in ("step 1 (tickets.create_ticket)", "tickets.close_ticket",
                     f'"id": "{made["id"]}"', '"reason": "rolled back by AgentTx"',
                     create.key, "tracker is read-only"):
        assert fragment in error, (fragment, error)
    assert get(cluster.b.stub, agent.tx).status == pb.TRANSACTION_STATUS_AWAITING_ROLLBACK
    again = cluster.b.stub.RollbackTransaction(pb.RollbackTransactionRequest(
        transaction_id=agent.tx, to_step=1, reason="the tracker is writable again"))
    assert (again.rolled_back, again.next_step_id, list(again.compensation_errors)) == \
        (True, 1, [])
    assert len(ups.tracker.calls_to("close_ticket", id=made["id"])) == 2   # failed, then done
    assert ticket(ups.tracker, made["id"])["status"] == "closed"


def test_arguments_that_break_the_upstream_schema_fail_before_any_call(cluster, ups):
    agent = Agent(cluster.a.stub)
    name = title("typed")
    resp = agent.step("tickets.create_ticket", {"title": name, "priority": "high"})
    expect_failure(resp, "invalid_parameter_value", '"priority"', 'string "high"',
                   "an integer")
    resp = agent.step("tickets.create_ticket", {"priority": 1})
    expect_failure(resp, "invalid_parameter_value", '"title" is missing')
    resp = agent.step("tickets.create_ticket", {"title": ["a", 7]})
    expect_failure(resp, "invalid_parameter_value", '"title"', "a string")
    assert ups.tracker.calls_to("create_ticket", title=name) == []


def test_references_resolve_in_toolset_arguments_and_outputs_feed_later_steps(cluster, ups):
    agent = Agent(cluster.a.stub)
    made = created(agent, "referenced")
    commented = agent.ok("tickets.add_comment", {"id": "${steps.1.id}",
                                                 "text": "see ${steps.1.title}"})
    assert commented == {"id": made["id"], "comments": [f"see {made['title']}"]}
    [call] = ups.tracker.calls_to("add_comment", id=made["id"])
    assert call.arguments["text"] == f"see {made['title']}"
    key = f"ticket-{uuid.uuid4().hex}"
    assert agent.ok("kv.put", {"key": key, "value": "${steps.2.comments}"})["value"] == \
        [f"see {made['title']}"]
    # a failure blamed on a reference goes back to the step that produced it
    resp = agent.step("kv.get", {"key": "${steps.2.id}"})
    assert (resp.error_category, resp.strategy, resp.rollback_to_step) == \
        ("no_data_found", pb.ROLLBACK_STRATEGY_DEPENDENCY_JUMP, 2)
    [delete] = ups.tracker.calls_to("delete_comment", id=made["id"])
    assert delete.arguments == {"id": made["id"], "text": f"see {made['title']}"}


def test_an_unknown_toolset_tool_is_undefined_function_with_the_closest_names(cluster):
    agent = Agent(cluster.a.stub)
    expect_failure(agent.step("tickets.create_tiket", {"title": "x"}), "undefined_function",
                   "tickets.create_ticket")


# ---- what callers see ------------------------------------------------------------------------

def test_list_tools_shows_each_toolset_tool_with_its_upstream_description_and_schema(
        cluster, ups):
    with Client(cluster.b.target) as client:
        tools = {t.name: t for t in client.tools()}
    create, search, send = (tools["tickets.create_ticket"], tools["tickets.search_tickets"],
                            tools["mail.send_email"])
    assert (create.kind, create.toolset) == ("saga", "default/tickets")
    assert create.description == ("Open a ticket in the team's tracker; returns it with its "
                                  "new id. Acts at once; if the transaction rolls back, "
                                  "AgentTx undoes it by calling close_ticket.")
    assert create.input_schema["required"] == ["title"]
    assert create.input_schema["properties"]["priority"]["type"] == "integer"
    assert (search.kind, send.kind) == ("read", "deferred")
    assert search.description.endswith("nothing to undo.")
    assert send.description == ("Send an email. Runs only when the transaction commits "
                                "(staged until then); a rollback discards it.")
    assert "tickets.close_ticket" not in tools      # only listed tools are exposed
    assert tools["kv.put"].toolset == ""


async def test_header_values_reach_the_upstream_and_nowhere_else(cluster, ups, secrets, store):
    agent = Agent(cluster.a.stub)
    made = created(agent, "authorised")
    [call] = ups.tracker.calls_to("create_ticket", title=made["title"])
    assert call.headers["authorization"] == secrets.file_value
    assert call.headers["x-api-key"] == secrets.literal
    # a rotated Secret is used from the next call on, without a restart
    rotated = f"Bearer rotated-{uuid.uuid4().hex}"
    secrets.file.write_text(rotated + "\n")
    try:
        def sent_rotated() -> bool:
            agent.ok("tickets.search_tickets", {"query": made["title"]})
            return ups.tracker.calls_to("search_tickets", query=made["title"])[-1] \
                .headers["authorization"] == rotated
        eventually(sent_rotated, slack(2), "the rotated header value sent")
        answers = [agent.commit().SerializeToString()]
        with Client(cluster.a.target) as client:
            answers.append(json.dumps([t.__dict__ for t in client.tools()], default=str)
                           .encode())
        failed = Agent(cluster.b.stub)
        ups.tracker.control.http_status = 401
        try:
            answers.append(failed.step("tickets.search_tickets", {"query": "x"})
                           .SerializeToString())
        finally:
            ups.tracker.control.http_status = None
        dump = b"".join(kv.key + kv.value
                        for kv in await store.get_prefix(cluster.prefix.encode()))
        logs = b"".join(p.log_path.read_bytes() for p in (cluster.a, cluster.b))
        for secret in (secrets.file_value, rotated, secrets.literal):
            needle = secret.encode()
            assert needle not in dump, "a header value is in etcd"
            assert needle not in logs, "a header value is in a replica's log"
            assert all(needle not in answer for answer in answers), "a header value answered"
            assert secret.split()[-1].encode() not in logs
    finally:
        secrets.file.write_text(secrets.file_value + "\n")



# ---- an MCP host, through `agenttx mcp` ------------------------------------------------------

async def test_an_mcp_host_sees_the_toolset_tools_and_agenttx_closes_a_ticket_on_rollback(
        cluster, ups):
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "agenttx", "mcp", "--target", cluster.a.target, "--agent-id", "mcp-host"])
    name = title("from the MCP host")
    async with McpClient(params, mode="legacy") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        create = tools["tickets_create_ticket"]
        assert create.description.startswith(
            "Open a ticket in the team's tracker; returns it with its new id. Acts at once; "
            "if the transaction rolls back, AgentTx undoes it by calling close_ticket.")
        assert set(create.input_schema["properties"]) == {"title", "priority", "transaction"}
        assert create.input_schema["required"] == ["title"]
        wire = {n: t.model_dump(by_alias=True, exclude_none=True, mode="json")["annotations"]
                for n, t in tools.items()}
        assert wire["tickets_create_ticket"] == {
            "title": "tickets.create_ticket", "readOnlyHint": False, "destructiveHint": True,
            "idempotentHint": False, "openWorldHint": True}
        assert wire["mail_send_email"]["destructiveHint"] is True
        assert wire["mail_send_email"]["openWorldHint"] is True
        assert wire["tickets_search_tickets"] == {"title": "tickets.search_tickets",
                                                  "readOnlyHint": True, "openWorldHint": True}
        # the host creates a ticket, a later step fails on it, AgentTx closes the ticket
        made = await mcp.call_tool("tickets_create_ticket", {"title": name})
        assert not made.is_error
        ticket_id = made.structured_content["output"]["id"]
        assert ticket(ups.tracker, ticket_id)["status"] == "open"
        bad = await mcp.call_tool("kv_get", {"key": "${steps.1.id}"})
        assert bad.is_error
        s = bad.structured_content
        assert (s["category"], s["strategy"], s["next_step"]) == \
            ("no_data_found", "DEPENDENCY_JUMP", 1)
        await mcp.call_tool("agenttx_rollback", {})
    [close] = ups.tracker.calls_to("close_ticket", id=ticket_id)
    assert close.arguments == {"id": ticket_id, "reason": "rolled back by AgentTx"}
    assert ticket(ups.tracker, ticket_id)["status"] == "closed"


# ---- the caller's trace continues upstream ----------------------------------------------------

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_the_callers_trace_context_reaches_the_upstream(etcd_endpoint, scratch,
                                                              etcd_prefix, cluster, ups):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.setup(provider)
    port = free_port()
    settings = Settings(listen=f"127.0.0.1:{port}", etcd_endpoints=etcd_endpoint,
                        etcd_prefix=etcd_prefix, fs_root=str(scratch / "trace-ts-sb"),
                        data_dir=str(scratch / "trace-ts-data"), grace_period_s=1,
                        toolsets_file=str(cluster.file))
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(settings, ready=ready, stop=stop))
    query = title("traced")
    try:
        await asyncio.wait_for(ready.wait(), 60)
        md = (("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01"),)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.AgentTxServiceStub(ch)
            tx = (await stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="t"),
                                              metadata=md)).transaction_id
            step = await stub.ExecuteStep(pb.ExecuteStepRequest(
                transaction_id=tx, step_id=1, tool_name="tickets.search_tickets",
                arguments_json=json.dumps({"query": query})), metadata=md)
            assert step.status == pb.STEP_STATUS_SUCCESS, step.clean_hint
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        tracing.shutdown()
    [call] = ups.tracker.calls_to("search_tickets", query=query)
    assert call.meta["traceparent"].split("-")[1] == TRACE_ID
    names = {s.name for s in exporter.get_finished_spans()}
    assert "execute_tool tickets.search_tickets" in names
