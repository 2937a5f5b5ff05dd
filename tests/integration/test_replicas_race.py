"""Steps are atomic and strictly ordered (docs/api.md#executestep): two replicas racing on the
same step of one transaction. Exactly one wins (SUCCESS), the other answers
FAILED_PRECONDITION, and the step is applied once."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc

from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import TIMEOUT_S, get
from support.service import Agent

ROUNDS = 20


def _race(stubs, make_request: Callable[[int], object], method: str = "ExecuteStep"
          ) -> list[object]:
    """Send one request per stub at the same moment; results are responses or RpcErrors."""
    barrier = threading.Barrier(len(stubs))

    def go(i: int) -> object:
        request = make_request(i)
        barrier.wait()
        try:
            return getattr(stubs[i], method)(request, timeout=TIMEOUT_S)
        except grpc.RpcError as err:
            return err

    with ThreadPoolExecutor(len(stubs)) as pool:
        return list(pool.map(go, range(len(stubs))))


def _one_winner(results: list[object]) -> int:
    wins = [i for i, r in enumerate(results) if isinstance(r, pb.ExecuteStepResponse)]
    losses = [r for r in results if isinstance(r, grpc.RpcError)]
    assert len(wins) == 1, results
    assert results[wins[0]].status == pb.STEP_STATUS_SUCCESS, results[wins[0]]
    assert len(losses) == len(results) - 1
    for err in losses:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, (err.code(), err.details())
        assert "step" in err.details()
    return wins[0]


def test_two_replicas_racing_on_a_kv_step_apply_it_once(a, b, uniq):
    for round_ in range(ROUNDS):
        agent = Agent(a)
        agent.ok("kv.put", {"key": f"k-{uniq}-{round_}", "value": "base"})
        results = _race([a, b], lambda i, tx=agent.tx, r=round_: pb.ExecuteStepRequest(
            transaction_id=tx, step_id=2, tool_name="kv.put",
            arguments_json=json.dumps({"key": f"k-{uniq}-{r}", "value": f"replica-{i}"})))
        winner = _one_winner(results)
        assert json.loads(results[winner].output_json)["value"] == f"replica-{winner}"
        view = get(b, agent.tx)
        assert view.next_step_id == 3
        agent.next = 3
        assert agent.ok("kv.get", {"key": f"k-{uniq}-{round_}"})["value"] == f"replica-{winner}"
        assert agent.commit().steps_committed == 3


def test_two_replicas_racing_on_an_fs_write_write_the_file_once(a, b, sandbox, uniq):
    for round_ in range(ROUNDS):
        agent = Agent(b)
        path = f"race-{uniq}/file-{round_}.txt"
        results = _race([a, b], lambda i, tx=agent.tx, p=path: pb.ExecuteStepRequest(
            transaction_id=tx, step_id=1, tool_name="fs.write", raw_context=f"replica {i}",
            arguments_json=json.dumps({"path": p, "contents": f"written by replica {i}"})))
        winner = _one_winner(results)
        assert (sandbox / path).read_text() == f"written by replica {winner}"
        view = get(a, agent.tx)
        assert view.next_step_id == 2
        assert [(c.step_id, c.raw_context) for c in view.context] == [(1, f"replica {winner}")]
        assert sorted(p.name for p in (sandbox / path).parent.iterdir()
                      if p.name.startswith(f".file-{round_}.txt")) == []  # no temp left behind
        agent.next = 2
        assert agent.ok("fs.read", {"path": path})["contents"] == f"written by replica {winner}"
        assert agent.commit().steps_committed == 2
        assert (sandbox / path).read_text() == f"written by replica {winner}"


def test_two_replicas_racing_on_commit_commit_once_and_deliver_effects_once(
        a, b, replicas, store, uniq):
    for round_ in range(ROUNDS // 2):
        agent = Agent(a)
        agent.ok("kv.put", {"key": f"c-{uniq}-{round_}", "value": round_})
        agent.ok("effect.stage", {"channel": "log", "idempotency_key": f"{uniq}-{round_}"})
        results = _race([a, b], lambda i, tx=agent.tx: pb.CommitTransactionRequest(
            transaction_id=tx), method="CommitTransaction")
        wins = [r for r in results if isinstance(r, pb.CommitTransactionResponse)]
        assert len(wins) == 1 and wins[0].committed and wins[0].steps_committed == 2, results
        err = next(r for r in results if isinstance(r, grpc.RpcError))
        assert err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION), \
            (err.code(), err.details())
        assert agent.tx in err.details()
    delivered = [r for p in replicas for r in p.logs()
                 if r.get("msg") == "effect" and str(r.get("idempotency_key", "")).startswith(uniq)]
    assert sorted(r["idempotency_key"] for r in delivered) == \
        sorted(f"{uniq}-{i}" for i in range(ROUNDS // 2))
