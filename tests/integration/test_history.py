"""GetTransactionHistory and `client.history()` against real replicas and a real etcd.

What a user sees once a transaction ended, however it ended: committed, aborted by the
planner, rolled back by a person, expired by the reaper (a replica with a 2 s idle
timeout) — status, who ended it and why, and one entry per step sent, failed attempts
included, with arguments and outputs cut at 4096 bytes. GetTransaction keeps answering
NOT_FOUND for ended transactions. History is kept for --history-retention-s after the
end (a replica with 4 s) and never while the transaction is open; in etcd it is one small
key per step sent, whatever came before.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from agenttx.client import (
    AsyncClient,
    Client,
    NotFound,
    StepStatus,
    Strategy,
    TransactionEnded,
    TransactionStatus,
)
from agenttx.contracts.layout import Keys
from agenttx.testing import ServiceProcess
from support.waiting import eventually, eventually_async, slack

IDLE_S = 2
RETENTION_S = 4
BUCKET_S = 1  # RetentionLease: max(1, min(3600, retention // 4))


@pytest.fixture(scope="module")
def short(etcd, scratch, sandbox) -> Iterator[ServiceProcess]:
    """A replica whose transactions expire after 2 s idle and whose history is kept 4 s."""
    proc = ServiceProcess("history-short", etcd_endpoints=etcd.endpoints,
                          prefix=f"/agenttx-hist-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                          workdir=scratch / "history",
                          env={"AGENTTX_TX_IDLE_TIMEOUT_S": str(IDLE_S),
                               "AGENTTX_HISTORY_RETENTION_S": str(RETENTION_S)}).start()
    yield proc
    proc.stop()


@pytest.fixture
def client(replicas) -> Iterator[Client]:
    with Client(replicas[0].target) as c:
        yield c


def compact(doc: object) -> str:
    """JSON as the client sends arguments and the service encodes outputs."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def _steps(history) -> list[tuple]:
    return [(s.step_id, s.tool, s.status, s.category, s.strategy, s.arguments_json,
             s.output_json) for s in history.steps]


# ---- how it ended -----------------------------------------------------------------------

def test_a_committed_transaction_keeps_every_step_sent_and_what_it_committed(client, uniq):
    began = time.time()
    tx = client.begin(agent_id=f"hist-{uniq}")
    tx.step("kv.put", {"key": f"h-{uniq}", "value": 42})
    failed = tx.step("kv.get", {"key": f"missing-{uniq}"})
    tx.step("effect.stage", {"channel": "log", "idempotency_key": f"k-{uniq}"})
    done = tx.commit()
    assert (done.committed, done.status) == (True, TransactionStatus.COMMITTED)
    with pytest.raises(NotFound):
        client.get(tx.id)  # ended: GetTransaction keeps the seed's rule
    h = client.history(tx.id)
    assert (h.transaction_id, h.status, h.agent_id, h.principal, h.ended_by, h.reason,
            h.steps_committed, h.effects) == \
        (tx.id, TransactionStatus.COMMITTED, f"hist-{uniq}", "", "", "", 2, 1)
    assert began <= h.created_at <= h.ended_at <= time.time()
    assert _steps(h) == [
        (1, "kv.put", StepStatus.SUCCESS, "", Strategy.NONE,
         compact({"key": f"h-{uniq}", "value": 42}), compact({"key": f"h-{uniq}", "value": 42})),
        (2, "kv.get", StepStatus.ROLLBACK_TRIGGERED, "no_data_found", Strategy.LOCAL_BACKTRACK,
         compact({"key": f"missing-{uniq}"}), ""),
        (2, "effect.stage", StepStatus.SUCCESS, "", Strategy.NONE,
         compact({"channel": "log", "idempotency_key": f"k-{uniq}"}),
         compact({"staged": True, "channel": "log", "idempotency_key": f"k-{uniq}"}))]
    assert h.steps[1].hint == failed.hint
    assert all(h.created_at <= s.at <= h.ended_at for s in h.steps)
    assert [s.at for s in h.steps] == sorted(s.at for s in h.steps)


def test_an_aborted_transaction_says_why_and_that_nothing_was_committed(client, uniq):
    tx = client.begin(policy={"max_local_depth": 0, "max_global_resets": 0})
    tx.step("kv.put", {"key": f"a-{uniq}", "value": 1})
    r = tx.step("kv.get", {"key": f"missing-{uniq}"})
    assert (r.strategy, r.ended) == (Strategy.ABORT, True)
    h = client.history(tx.id)
    assert (h.status, h.ended_by, h.reason, h.steps_committed, h.effects) == \
        (TransactionStatus.ABORTED, "", r.abort_reason, 0, 0)
    assert r.abort_reason.startswith("global reset limit reached (0 of 0) after step 2 failed")
    assert [(s.step_id, s.status, s.category, s.strategy, s.hint) for s in h.steps] == [
        (1, StepStatus.SUCCESS, "", Strategy.NONE, ""),
        (2, StepStatus.FAILED, "no_data_found", Strategy.ABORT, r.hint)]


def test_a_manually_rolled_back_transaction_keeps_the_rollback_reason(client, sandbox, uniq):
    tx = client.begin(agent_id=f"manual-{uniq}")
    tx.step("fs.write", {"path": f"hist-{uniq}.txt", "contents": "draft"})
    tx.step("kv.put", {"key": f"m-{uniq}", "value": 1})
    assert tx.rollback(to_step=2).next_step_id == 2  # a rewind leaves it open
    h = client.history(tx.id)
    assert (h.status, h.ended_at, h.ended_by, h.reason) == (TransactionStatus.ACTIVE, 0.0, "", "")
    assert [s.tool for s in h.steps] == ["fs.write", "kv.put"]  # what was sent, undone or not
    assert tx.rollback(reason="the customer cancelled").rolled_back
    assert not (sandbox / f"hist-{uniq}.txt").exists()
    h = client.history(tx.id)
    assert (h.status, h.ended_by, h.reason, h.steps_committed) == \
        (TransactionStatus.ABORTED, "", "the customer cancelled", 0)
    assert [(s.step_id, s.tool, s.status) for s in h.steps] == [
        (1, "fs.write", StepStatus.SUCCESS), (2, "kv.put", StepStatus.SUCCESS)]


def test_an_expired_transaction_was_ended_by_the_reaper(short, uniq):
    with Client(short.target) as client:
        tx = client.begin(agent_id=f"idle-{uniq}")
        tx.step("kv.put", {"key": f"e-{uniq}", "value": 1})
        h = eventually(lambda: (found := client.history(tx.id)).ended and found,
                       slack(IDLE_S + 1), "the reaper expiring the idle transaction")
    assert (h.status, h.ended_by, h.reason, h.steps_committed) == \
        (TransactionStatus.EXPIRED, "reaper", f"no call for {IDLE_S} s (idle timeout)", 0)
    assert h.ended_at - h.steps[0].at >= IDLE_S
    assert [(s.step_id, s.tool, s.status) for s in h.steps] == [(1, "kv.put", StepStatus.SUCCESS)]


def test_leaving_a_block_the_reaper_ended_raises_transaction_ended_with_the_history(short, uniq):
    with Client(short.target) as client:
        with pytest.raises(TransactionEnded) as left:
            with client.transaction(agent_id=f"slow-{uniq}") as tx:
                tx.step("kv.put", {"key": f"s-{uniq}", "value": 1})
                eventually(lambda: client.history(tx.id).ended, slack(IDLE_S + 1),
                           "the reaper expiring the idle transaction")
        assert left.value.history is not None
        assert (left.value.history.status, left.value.history.ended_by) == \
            (TransactionStatus.EXPIRED, "reaper")
        assert str(left.value) == (
            f"NOT_FOUND: transaction {tx.id} was ended by the service (EXPIRED by reaper: no "
            f"call for {IDLE_S} s (idle timeout)); nothing of it was committed")


async def test_an_async_block_the_reaper_ended_raises_transaction_ended_too(short, uniq):
    async with AsyncClient(short.target) as client:
        with pytest.raises(TransactionEnded) as left:
            async with client.transaction(agent_id=f"aslow-{uniq}") as tx:
                await tx.step("kv.put", {"key": f"as-{uniq}", "value": 1})

                async def expired() -> bool:
                    return (await client.history(tx.id)).ended
                await eventually_async(expired, slack(IDLE_S + 1), "the reaper expiring it")
        assert left.value.history is not None
        assert left.value.history.status is TransactionStatus.EXPIRED


def test_texts_are_cut_at_4096_bytes_of_utf8_ending_with_an_ellipsis(client, uniq):
    tx = client.begin()
    tx.step("kv.put", {"key": f"long-{uniq}", "value": "é" * 5000})
    h = tx.history()
    tx.rollback()
    [step] = h.steps
    for text in (step.arguments_json, step.output_json):
        assert len(text.encode()) <= 4096 and len(text.encode()) >= 4096 - 4
        assert text.endswith("…") and text[-2] == "é"
    assert step.arguments_json.startswith(f'{{"key":"long-{uniq}","value":"éé')


def test_an_unknown_transaction_has_no_history(client):
    with pytest.raises(NotFound) as err:
        client.history(str(uuid.uuid4()))
    assert "not found" in err.value.details


# ---- retention -----------------------------------------------------------------------

def test_history_is_kept_for_the_retention_then_not_found(short, uniq):
    with Client(short.target) as client:
        tx = client.begin()
        tx.step("kv.put", {"key": f"r-{uniq}", "value": 1})
        tx.commit()
        ended_at = client.history(tx.id).ended_at

        def gone() -> bool:
            try:
                client.history(tx.id)
            except NotFound:
                return True
            return False
        eventually(gone, slack(RETENTION_S + 2 * BUCKET_S), "the history expiring")
        assert time.time() - ended_at >= RETENTION_S  # kept at least the retention


def test_an_open_transactions_history_never_expires(short, uniq):
    with Client(short.target) as client:
        tx = client.begin()
        tx.step("kv.put", {"key": f"open-{uniq}", "value": 1})
        first = tx.history().steps
        # keep it open (each get is activity for the idle reaper) for longer than a
        # history lease lives unrefreshed: retention + a bucket, plus margin
        until = time.monotonic() + RETENTION_S + 3 * BUCKET_S
        while time.monotonic() < until:
            assert tx.get().status is TransactionStatus.ACTIVE
            time.sleep(0.5)  # the activity cadence itself, not a wait for a condition
        assert tx.history().steps == first
        tx.rollback()


# ---- cost: one small key per step sent --------------------------------------------------

async def test_each_step_sent_adds_one_small_key_and_the_header_stays_small(replicas, store,
                                                                           uniq):
    args = replicas[0].args
    keys = Keys(args[args.index("--etcd-prefix") + 1])
    async with AsyncClient(replicas[0].target) as client:
        tx = await client.begin()
        sizes = []
        for i in range(40):
            await tx.step("kv.put", {"key": f"c-{uniq}-{i}", "value": "v" * 100})
            header = await store.get(keys.tx_header(tx.id))
            sizes.append(len(header.value))
        await tx.step("kv.get", {"key": f"missing-{uniq}"})
        entries = await store.get_prefix(keys.history_steps_prefix(tx.id))
        assert [kv.key for kv in entries] == [keys.history_step(tx.id, i) for i in range(41)]
        assert max(len(kv.value) for kv in entries) < 600
        assert sizes[39] - sizes[9] <= 3  # counters and a clock, never a list of steps
        assert len({kv.lease for kv in entries}) == 1 and entries[0].lease != 0
        await tx.rollback()
        assert await store.get(keys.history_end(tx.id)) is not None
    assert [s.step_id for s in (await _history(replicas, tx.id)).steps] == \
        list(range(1, 41)) + [41]


async def _history(replicas, tx_id: str):
    async with AsyncClient(replicas[1].target) as client:
        return await client.history(tx_id)
