"""A replica killed between a toolset saga call and the step's record (the failpoint
`toolset.saga.after_call`, SIGKILL: what a node failure looks like). The upstream acted;
etcd holds only the intent. Another replica, or the reaper, finds it: compensated from
the call's arguments when it can be, otherwise the transaction waits for a person, with
the call, its arguments and its idempotency key named. Never forgotten, never
compensated twice (docs/toolsets.md, "Crash windows").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from agenttx.v1 import agenttx_pb2 as pb
from support.mcp_upstreams import Upstreams, declaration, mailer, ticket, tracker
from support.rpc import ended, expect_error, get
from support.service import Agent, ServiceProcess
from support.waiting import eventually, slack

REPLICA_TTL_S = 2      # the killed replica's liveness lease: others take over after it
LEADER_TTL_S = 2
IDLE_S = 3             # the reaper test's idle timeout
REAPER_PASS_S = 5.0    # the surviving reaper's interval (its own idle timeout is 900 s)


@dataclass
class Setup:
    survivor: ServiceProcess
    prefix: str
    file: Path
    args: dict


@pytest.fixture(scope="module")
def ups() -> Iterator[Upstreams]:
    with tracker() as t, mailer() as m:
        yield Upstreams(t, m)


@pytest.fixture(scope="module")
def setup(etcd, scratch, sandbox, ups) -> Iterator[Setup]:
    prefix = f"/agenttx-tscrash-{uuid.uuid4().hex[:8]}"
    path = scratch / f"toolsets-crash-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(declaration(ups)))
    args = dict(etcd_endpoints=etcd.endpoints, prefix=prefix, fs_root=str(sandbox),
                workdir=scratch / "toolsets-crash")
    flags = ["--toolsets-file", str(path), "--replica-ttl-s", str(REPLICA_TTL_S),
             "--leader-ttl-s", str(LEADER_TTL_S)]
    survivor = ServiceProcess("toolsets-survivor", extra_args=flags, **args).start()
    yield Setup(survivor, prefix, path, {**args, "flags": flags})
    survivor.stop()


@pytest.fixture
def doomed(setup) -> Iterator[ServiceProcess]:
    """A replica that dies right after its next toolset saga call reached the upstream."""
    args = dict(setup.args)
    flags = args.pop("flags")
    proc = ServiceProcess(f"toolsets-doomed-{uuid.uuid4().hex[:4]}",
                          env={"AGENTTX_FAILPOINTS": "toolset.saga.after_call=crash"},
                          extra_args=[*flags, "--tx-idle-timeout-s", str(IDLE_S)], **args)
    yield proc.start()
    proc.stop()


def killed(call) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def open_ticket(setup: Setup) -> dict:
    agent = Agent(setup.survivor.stub)
    made = agent.ok("tickets.create_ticket", {"title": f"crash {uuid.uuid4().hex[:8]}"})
    assert agent.commit().committed
    return made


def test_another_replica_compensates_from_the_arguments_once(setup, doomed, ups):
    made = open_ticket(setup)
    agent = Agent(doomed.stub)          # begun on the doomed replica
    killed(lambda: agent.step("tickets.add_comment", {"id": made["id"], "text": "orphan"}))
    assert ticket(ups.tracker, made["id"])["comments"] == ["orphan"]   # the upstream acted

    def compensated() -> bool:
        view = get(setup.survivor.stub, agent.tx)  # finds the intent, settles it
        return view.next_step_id == 1 and bool(ups.tracker.calls_to("delete_comment",
                                                                    id=made["id"]))
    eventually(compensated, slack(REPLICA_TTL_S + 1), "the orphan comment compensated")
    [delete] = ups.tracker.calls_to("delete_comment", id=made["id"])
    [add] = ups.tracker.calls_to("add_comment", id=made["id"])
    assert delete.arguments == {"id": made["id"], "text": "orphan"}
    assert delete.key == f"{add.key}/undo"
    assert ticket(ups.tracker, made["id"])["comments"] == []
    # the step did not apply: it is sent again, on the survivor, and commits
    agent.stub = setup.survivor.stub
    agent.next = 1
    agent.ok("tickets.add_comment", {"id": made["id"], "text": "again"})
    assert agent.commit().committed
    assert ticket(ups.tracker, made["id"])["comments"] == ["again"]
    assert len(ups.tracker.calls_to("delete_comment", id=made["id"])) == 1   # never twice


def test_a_call_whose_undo_needs_its_output_waits_for_a_person_naming_it(setup, doomed, ups):
    agent = Agent(doomed.stub)
    name = f"orphan ticket {uuid.uuid4().hex[:8]}"
    killed(lambda: agent.step("tickets.create_ticket", {"title": name}))
    [create] = ups.tracker.calls_to("create_ticket", title=name)

    def held() -> pb.GetTransactionResponse | None:
        view = get(setup.survivor.stub, agent.tx)
        return view if view.status == pb.TRANSACTION_STATUS_AWAITING_ROLLBACK else None
    view = eventually(held, slack(REPLICA_TTL_S + 1), "the transaction held for a person")
    assert any(create.key in c and "check the upstream" in c for c in view.constraints)
    expect_error(setup.survivor.stub.CommitTransaction,
                 pb.CommitTransactionRequest(transaction_id=agent.tx),
                 grpc.StatusCode.FAILED_PRECONDITION, "manual rollback")
    stub = setup.survivor.stub
    first = stub.RollbackTransaction(pb.RollbackTransactionRequest(
        transaction_id=agent.tx, to_step=1, reason="what happened?"))
    assert first.rolled_back is False
    [error] = first.compensation_errors
    for fragment in ("step 1 (tickets.create_ticket)", f'"title": "{name}"', create.key,
                     "close_ticket needs the call's output"):
        assert fragment in error, (fragment, error)
    # a person checked the tracker (and closed the orphan by hand); then:
    second = stub.RollbackTransaction(pb.RollbackTransactionRequest(
        transaction_id=agent.tx, to_step=1, reason="orphan closed by hand"))
    assert (second.rolled_back, second.next_step_id) == (True, 1)
    assert get(stub, agent.tx).status == pb.TRANSACTION_STATUS_ACTIVE
    orphan = [t for t in ups.tracker.state["tickets"].values() if t["title"] == name]
    assert [t["status"] for t in orphan] == ["open"]     # AgentTx never guessed at it
    assert ups.tracker.calls_to("close_ticket", id=orphan[0]["id"]) == []


def test_the_reaper_compensates_an_idle_transaction_left_by_a_dead_replica_once(
        setup, doomed, ups):
    made = open_ticket(setup)
    agent = Agent(doomed.stub)          # idle timeout IDLE_S, from the doomed replica
    killed(lambda: agent.step("tickets.add_comment", {"id": made["id"], "text": "reaped"}))
    # nobody calls: the survivor's reaper finds the idle transaction and its intent
    eventually(lambda: ups.tracker.calls_to("delete_comment", id=made["id"]),
               slack(LEADER_TTL_S + IDLE_S + REAPER_PASS_S), "the reaper's compensation")
    eventually(lambda: ended(setup.survivor.stub, agent.tx), slack(REAPER_PASS_S),
               "the idle transaction aborted")
    assert ticket(ups.tracker, made["id"])["comments"] == []
    assert len(ups.tracker.calls_to("delete_comment", id=made["id"])) == 1


