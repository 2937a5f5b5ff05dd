"""The example tools, installed and used through a real `agenttx serve`.

This is how a custom tool package is tested: `agenttx.testing` starts a real etcd and a
real `agenttx serve` for the session (the pytest plugin below), the service loads this
package's tools from the `agenttx.tools` entry-point group of the environment it runs in,
and the tests drive it with the public client, `agenttx.client`, exactly like an agent.
Nothing is imported from the service's own test suite. Run after
`pip install -e examples/agenttx-example-tools`.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any

import pytest

from agenttx.client import Client, StepResult, Strategy, Transaction
from agenttx.testing import Service

# Fixtures `agenttx_service` (session) and `agenttx_client` (per test).
pytest_plugins = ["agenttx.testing.pytest_plugin"]


@pytest.fixture(scope="session")
def tickets(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("tickets")


@pytest.fixture(scope="session")
def agenttx_service_options(tickets: pathlib.Path) -> dict[str, Any]:
    """How the plugin starts the service: where ticket.create keeps its files."""
    return {"env": {"AGENTTX_EXAMPLE_TICKETS_DIR": str(tickets)}}


def ok(tx: Transaction, tool: str, args: Any) -> Any:
    r = tx.step(tool, args)
    assert r.ok, (r.category, r.hint)
    return r.output


def failed(r: StepResult, category: str, *fragments: str) -> str:
    assert not r.ok, r.output_json
    assert r.category == category, (r.category, r.hint)
    for fragment in fragments:
        assert fragment in r.hint, (fragment, r.hint)
    return r.hint


def uniq() -> str:
    return os.urandom(5).hex()


# ---- the tools are loaded -------------------------------------------------------------------

def test_the_plugin_tools_are_loaded_and_suggested_for_typos(agenttx_service: Service,
                                                            agenttx_client: Client) -> None:
    loaded = {r.get("tool") for r in agenttx_service.logs()
              if r.get("msg") == "loaded tool plug-in"}
    assert {"ticket.create", "counter.add", "notify.team"} <= loaded
    with agenttx_client.transaction() as tx:
        failed(tx.step("ticket.creat", {"id": "x", "title": "t"}), "undefined_function",
               '"ticket.create"')
        tx.rollback()


# ---- ticket.create: SAGA ---------------------------------------------------------------------

def test_ticket_create_writes_now_and_its_compensation_removes_the_file(
        agenttx_client: Client, tickets: pathlib.Path) -> None:
    tid = f"T-{uniq()}"
    ticket = tickets / f"{tid}.json"
    with agenttx_client.transaction(agent_id="example-tools-test") as tx:
        assert ok(tx, "ticket.create", {"id": tid, "title": "printer on fire",
                                        "priority": "high"}) == \
            {"id": tid, "title": "printer on fire", "priority": "high"}
        assert json.loads(ticket.read_text())["transaction_id"] == tx.id  # visible at once
        ok(tx, "counter.add", {"key": f"tickets-{tid}"})
        r = tx.rollback(to_step=1)
        assert (r.rolled_back, r.compensations_run, r.next_step_id) == (True, 2, 1)
        assert not ticket.exists()
        # created again; leaving the block commits it, and it stays
        ok(tx, "ticket.create", {"id": tid, "title": "printer still on fire"})
    assert json.loads(ticket.read_text())["title"] == "printer still on fire"


def test_an_automatic_rollback_compensates_the_ticket(agenttx_client: Client,
                                                     tickets: pathlib.Path) -> None:
    tid = f"T-{uniq()}"
    ticket = tickets / f"{tid}.json"
    tx = agenttx_client.begin(policy={"max_local_depth": 0})
    ok(tx, "ticket.create", {"id": tid, "title": "t"})
    r = tx.step("kv.gett", {})  # no dependencies, depth 0: GLOBAL_RESET
    assert r.strategy is Strategy.GLOBAL_RESET, r
    assert not ticket.exists()
    tx.rollback()


def test_a_duplicate_ticket_is_cleaned_exactly_like_the_builtin_duplicate(
        agenttx_client: Client) -> None:
    tid = f"T-{uniq()}"
    custom, builtin = agenttx_client.begin(), agenttx_client.begin()
    ok(custom, "ticket.create", {"id": tid, "title": "first"})
    mine = custom.step("ticket.create", {"id": tid, "title": "second"})
    ok(builtin, "record.insert", {"table": "tickets", "id": tid})
    theirs = builtin.step("record.insert", {"table": "tickets", "id": tid})
    hint = failed(mine, "unique_violation", f'"{tid}"', '"tickets"')
    assert (theirs.category, theirs.hint) == (mine.category, hint)
    assert mine.constraints == (hint,)
    assert mine.strategy == theirs.strategy == Strategy.LOCAL_BACKTRACK
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
def test_argument_model_errors_read_like_the_builtins(agenttx_client: Client, tool: str,
                                                      args: Any, fragments: list[str]) -> None:
    with agenttx_client.transaction() as tx:
        hint = failed(tx.step(tool, args), "invalid_parameter_value", *fragments)
        tx.rollback()
    assert "\n" not in hint and len(hint) <= 200


# ---- counter.add: JOURNAL --------------------------------------------------------------------

def test_counter_add_buffers_its_writes_until_commit(agenttx_client: Client) -> None:
    key = f"hits-{uniq()}"
    with agenttx_client.transaction() as tx:
        assert ok(tx, "counter.add", {"key": key, "amount": 2})["value"] == 2
        assert ok(tx, "counter.add", {"key": key, "amount": 3}) == \
            {"key": key, "value": 5, "previous": 2}
        with agenttx_client.transaction() as other:  # isolation: not visible yet
            failed(other.step("kv.get", {"key": key}), "no_data_found", key)
            other.rollback()
    with agenttx_client.transaction() as tx:
        assert ok(tx, "kv.get", {"key": key})["value"] == 5


def test_a_bad_counter_value_escalates_to_the_step_that_wrote_it(agenttx_client: Client) -> None:
    key = f"hits-{uniq()}"
    tx = agenttx_client.begin(policy={"max_local_depth": 1})
    ok(tx, "kv.put", {"key": key, "value": "many"})
    ok(tx, "kv.put", {"key": f"other-{uniq()}", "value": 1})
    first = tx.step("counter.add", {"key": key})
    failed(first, "invalid_text_representation", '"many"', "integer")
    assert first.strategy is Strategy.LOCAL_BACKTRACK
    again = tx.step("counter.add", {"key": key})
    assert again.strategy is Strategy.DEPENDENCY_JUMP
    assert (again.rollback_to_step, again.next_step_id, tx.next_step_id) == (1, 1, 1)
    tx.rollback()


# ---- notify.team: EFFECT ---------------------------------------------------------------------

def effect_logged(service: Service, message: str) -> bool:
    return any(r.get("msg") == "effect" and (r.get("payload") or {}).get("message") == message
               for r in service.logs())


def test_notify_team_is_sent_after_commit_and_never_after_rollback(
        agenttx_service: Service, agenttx_client: Client) -> None:
    dropped, sent = f"dropped {uniq()}", f"sent {uniq()}"
    with agenttx_client.transaction() as tx:
        out = ok(tx, "notify.team", {"team": "oncall", "message": dropped})
        assert out["staged"] is True and out["channel"] == "log" and out["idempotency_key"]
        tx.rollback()

    with agenttx_client.transaction() as tx:
        ok(tx, "notify.team", {"team": "oncall", "message": sent})
        done = tx.commit()
    assert (done.committed, done.effects_dispatched) == (True, 1), done
    deadline = time.monotonic() + 10
    while not effect_logged(agenttx_service, sent):
        assert time.monotonic() < deadline, "the committed effect was not delivered"
        time.sleep(0.1)
    assert not effect_logged(agenttx_service, dropped)


def test_notify_team_on_an_unknown_channel_fails_the_step(agenttx_client: Client) -> None:
    with agenttx_client.transaction() as tx:
        r = tx.step("notify.team", {"team": "oncall", "message": "m", "channel": "pager"})
        failed(r, "undefined_object", '"pager"', '"log"')
        tx.rollback()
