"""`agenttx.client.AsyncClient`: the same surface and rules as `Client`, awaited
(`async with aclient.transaction(...) as tx: await tx.step(...)`), against the real replicas."""

from __future__ import annotations

import grpc
import pytest

from agenttx.client import (
    AsyncClient,
    AsyncTransaction,
    CommitResult,
    Conflict,
    NotFound,
    Policy,
    RollbackResult,
    Strategy,
    TransactionEnded,
    TransactionStatus,
)


@pytest.fixture
async def aclient(replicas):
    async with AsyncClient(replicas[0].target) as c:
        yield c


@pytest.fixture
async def aclient_b(replicas):
    async with AsyncClient(replicas[1].target) as c:
        yield c


async def _committed_value(client: AsyncClient, key: str):
    tx = await client.begin()
    r = await tx.step("kv.get", {"key": key})
    await tx.rollback()
    return r.output["value"] if r.ok else None


async def test_async_block_commits_when_it_ends_normally(aclient, aclient_b, uniq):
    async with aclient.transaction(agent_id=f"async-{uniq}") as tx:
        assert isinstance(tx, AsyncTransaction) and tx.next_step_id == 1
        r = await tx.step("kv.put", {"key": f"ak-{uniq}", "value": [1, 2]}, context="list")
        assert (r.ok, r.output, r.next_step_id) == (True, {"key": f"ak-{uniq}", "value": [1, 2]}, 2)
        state = await tx.get()
        assert (state.status, state.next_step_id, state.agent_id) == \
            (TransactionStatus.ACTIVE, 2, f"async-{uniq}")
        assert [(c.step_id, c.raw_context) for c in state.context] == [(1, "list")]
    assert tx.finished
    assert await _committed_value(aclient_b, f"ak-{uniq}") == [1, 2]
    with pytest.raises(NotFound):
        await aclient.get(tx.id)


async def test_async_exception_aborts_and_restores_files(aclient, sandbox, uniq):
    path = sandbox / f"async-{uniq}.txt"
    path.write_text("before")
    with pytest.raises(ValueError):
        async with aclient.transaction() as tx:
            assert (await tx.step("fs.write", {"path": path.name, "contents": "after"})).ok
            assert path.read_text() == "after"
            raise ValueError("stop")
    assert path.read_text() == "before"
    with pytest.raises(NotFound):
        await tx.get()


async def test_async_explicit_commit_rollback_and_rewind(aclient, uniq):
    async with aclient.transaction() as tx:
        await tx.step("kv.put", {"key": f"x1-{uniq}", "value": 1})
        await tx.step("kv.put", {"key": f"x2-{uniq}", "value": 2})
        assert await tx.rollback(to_step=2) == RollbackResult(True, 2, 1, ())
        assert await tx.commit() == CommitResult(True, 1, 0, ())
    async with aclient.transaction() as tx:
        await tx.step("kv.put", {"key": f"x3-{uniq}", "value": 3})
        assert (await tx.rollback()).rolled_back
    assert [await _committed_value(aclient, f"{k}-{uniq}") for k in ("x1", "x2", "x3")] == \
        [1, None, None]


async def test_async_abort_strategy_and_conflict(aclient, aclient_b, uniq):
    with pytest.raises(TransactionEnded) as left:
        async with aclient.transaction(policy=Policy(max_local_depth=0,
                                                     max_global_resets=0)) as tx:
            r = await tx.step("no.such.tool", {})
            assert (r.strategy, r.ended) == (Strategy.ABORT, True)
            with pytest.raises(TransactionEnded):
                await tx.step("kv.put", {"key": "x"})
    assert left.value.history is not None and left.value.history.reason == r.abort_reason

    loser = await aclient.begin()
    await loser.step("kv.put", {"key": f"race-{uniq}", "value": "loser"})
    async with aclient_b.transaction() as winner:
        await winner.step("kv.put", {"key": f"race-{uniq}", "value": "winner"})
    with pytest.raises(Conflict) as err:
        await loser.commit()
    assert err.value.code == grpc.StatusCode.ABORTED and loser.finished
    with pytest.raises(NotFound):
        await loser.get()
    resumed = await aclient.attach((await aclient.begin()).id)
    assert resumed.next_step_id == 1
    await resumed.rollback()
