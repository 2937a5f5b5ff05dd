"""A replica SIGKILLed at each named failpoint loses nothing acknowledged.

Each test runs its own pair of replicas on a fresh prefix over the session etcd: a
"doomed" one armed with AGENTTX_FAILPOINTS, and a healthy one that takes over. The
replicas' liveness leases are short (2 s) so takeover is quick.
"""

from __future__ import annotations

import json
import uuid

import grpc
import pytest

from agenttx.v1 import agenttx_pb2 as pb
from support.outbox import outbox_is_empty
from support.service import Agent, ServiceProcess
from support.waiting import eventually, slack

REPLICA_TTL_S = 2   # a killed replica's liveness lease lapses after this: takeover
CLAIM_S = 3         # a killed committer's claim on its outbox entries lapses after this
POLL_S = 0.2
FAST = ["--replica-ttl-s", str(REPLICA_TTL_S), "--leader-ttl-s", "2",
        "--effect-claim-s", str(CLAIM_S), "--effect-poll-s", str(POLL_S)]


@pytest.fixture
def pair(etcd, scratch, sandbox):
    prefix = f"/agenttx-crash-{uuid.uuid4().hex[:8]}"
    started: list[ServiceProcess] = []

    def make(failpoint: str | None = None, env: dict | None = None):
        name = f"crash-{'doomed' if failpoint else 'healthy'}-{uuid.uuid4().hex[:4]}"
        extra_env = dict(env or {})
        if failpoint:
            extra_env["AGENTTX_FAILPOINTS"] = f"{failpoint}=crash"
        p = ServiceProcess(name, etcd_endpoints=etcd.endpoints, prefix=prefix,
                           fs_root=str(sandbox), workdir=scratch / "crash", env=extra_env,
                           extra_args=FAST).start()
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


def _dies(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                                grpc.StatusCode.INTERNAL), err.value


def _eventually(fn, what: str = "the healthy replica takes over"):
    """`fn()` once the killed replica's liveness lease lapsed and the healthy one
    settles what it left."""
    return eventually(fn, slack(REPLICA_TTL_S), what)


def _setup(sandbox, healthy, uniq):
    path = f"crash-{uniq}.txt"
    (sandbox / path).write_text("previous")
    agent = Agent(healthy.stub)
    agent.ok("kv.put", {"key": f"crash-{uniq}", "value": 1}, context="kept")
    return agent, path


def test_killed_after_intent_rolls_the_write_back_and_the_step_can_be_retried(pair, sandbox, uniq):
    healthy, doomed = pair(), pair("fs.write.after_intent")
    agent, path = _setup(sandbox, healthy, uniq)
    _dies(lambda: agent.step("fs.write", {"path": path, "contents": "half"}, stub=doomed.stub))
    assert (sandbox / path).read_text() == "previous"  # never renamed into place

    def retried():
        agent.next = 2
        return agent.ok("fs.write", {"path": path, "contents": "second try"})
    assert _eventually(retried) == {"path": path, "bytes": 10}
    assert (sandbox / path).read_text() == "second try"
    state = agent.get()
    assert state.next_step_id == 3 and [c.raw_context for c in state.context] == ["kept"]
    assert agent.commit().steps_committed == 2
    assert not list(sandbox.glob(f".crash-{uniq}.txt.agenttx-*"))  # no temp file left


def test_killed_before_intent_leaves_no_step_and_no_change(pair, sandbox, uniq):
    healthy, doomed = pair(), pair("fs.write.before_intent")
    agent, path = _setup(sandbox, healthy, uniq)
    _dies(lambda: agent.step("fs.write", {"path": path, "contents": "never"}, stub=doomed.stub))
    assert (sandbox / path).read_text() == "previous"
    agent.next = 2
    assert agent.get().next_step_id == 2
    assert agent.rollback().rolled_back  # abort: nothing of step 2 to undo
    assert (sandbox / path).read_text() == "previous"


def test_killed_after_rename_keeps_the_applied_step(pair, sandbox, uniq):
    healthy, doomed = pair(), pair("fs.write.after_rename")
    agent, path = _setup(sandbox, healthy, uniq)
    _dies(lambda: agent.step("fs.write", {"path": path, "contents": "landed"}, stub=doomed.stub))
    # The write completed before the crash; the agent learns it from GetTransaction.
    state = _eventually(lambda: agent.get())
    assert state.next_step_id == 3
    assert (sandbox / path).read_text() == "landed"
    agent.next = 3
    # and it is still undoable: an abort restores the previous bytes
    assert agent.rollback().rolled_back
    assert (sandbox / path).read_text() == "previous"


def test_killed_mid_rollback_is_resumed_by_another_replica(pair, sandbox, uniq):
    healthy, doomed = pair(), pair("undo.after_intent")
    agent, path = _setup(sandbox, healthy, uniq)
    agent.ok("fs.write", {"path": path, "contents": "to be undone"})
    agent.ok("kv.put", {"key": f"after-{uniq}", "value": 2})
    req = pb.RollbackTransactionRequest(transaction_id=agent.tx, to_step=2, reason="test")
    _dies(lambda: doomed.stub.RollbackTransaction(req))
    assert (sandbox / path).read_text() == "to be undone"  # the crash came before the restore

    def resumed():
        state = agent.get()  # shows the state as it stands until the owner's lease lapses
        assert state.next_step_id == 2
        return state
    state = _eventually(resumed)
    assert state.status == pb.TRANSACTION_STATUS_ACTIVE
    assert (sandbox / path).read_text() == "previous"
    agent.next = 2
    agent.ok("kv.put", {"key": f"again-{uniq}", "value": 3})
    assert agent.commit().steps_committed == 2


def test_killed_after_commit_still_delivers_the_effect_once(pair, sandbox, uniq, webhook):
    channels = json.dumps({"hooks": {"kind": "webhook", "url": webhook.url}})
    env = {"AGENTTX_EFFECT_CHANNELS": channels}
    healthy, doomed = pair(env=env), pair("commit.after_txn", env=env)
    agent = Agent(doomed.stub)
    key = f"crash-effect-{uniq}"
    agent.ok("effect.stage", {"channel": "hooks", "payload": {"n": 1}, "idempotency_key": key})
    _dies(lambda: agent.commit())
    # The commit applied (acknowledged data is safe) ...
    with pytest.raises(grpc.RpcError) as err:
        Agent(healthy.stub).stub.GetTransaction(pb.GetTransactionRequest(transaction_id=agent.tx))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # ... and the healthy replica's dispatcher delivers the effect once the claim lapses.
    eventually(lambda: webhook.keys()[key] == 1, slack(CLAIM_S + POLL_S),
               "the healthy replica delivers the effect")
    # delivered and deleted from the outbox: it can never be sent again
    eventually(lambda: outbox_is_empty(healthy), slack(POLL_S), "the entry is retired")
    assert webhook.keys()[key] == 1
