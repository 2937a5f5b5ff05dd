"""Outcomes are never silent (docs/client.md): what leaving a `with client.transaction()`
block does, for the blocking and the asyncio client alike, against a real replica whose
effects go to a real loopback webhook receiver.

The quickstart's steps (a failing order, its retry, a receipt file, a staged effect) in a
block that is left without `tx.commit()` raise `StepFailed` and commit nothing: no row,
no receipt file, no webhook call. The same steps with `tx.commit()` after the recovery
commit all of it. `strict=True` raises at the failing step. A transaction that someone
else ended meanwhile raises `TransactionEnded` with its history. Bad input is refused
by the client before any call, and a closed client of either kind refuses calls.
"""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from agenttx.client import (
    AsyncClient,
    Client,
    CommitResult,
    InvalidArgument,
    NotFound,
    StepFailed,
    StepResult,
    StepStatus,
    Strategy,
    TransactionEnded,
    TransactionStatus,
)
from agenttx.embedded_etcd import free_port
from agenttx.testing import ServiceProcess


@pytest.fixture(scope="module")
def svc(etcd, scratch, sandbox, hooks) -> Iterator[ServiceProcess]:
    channels = {"hooks": {"kind": "webhook", "url": hooks.url, "timeout_s": 2}}
    proc = ServiceProcess("outcomes", etcd_endpoints=etcd.endpoints,
                          prefix=f"/agenttx-outcomes-{uuid.uuid4().hex[:6]}",
                          fs_root=str(sandbox), workdir=scratch / "outcomes",
                          env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)}).start()
    yield proc
    proc.stop()


class Quickstart:
    """examples/quickstart.py's steps with fresh ids, its effect on the webhook channel."""

    def __init__(self, sandbox: pathlib.Path) -> None:
        run = uuid.uuid4().hex[:6]
        self.customer, self.order, self.key = f"ada-{run}", f"o-{run}", f"placed-{run}"
        self.receipt = sandbox / "receipts" / f"{self.order}.txt"

    def steps(self) -> list[tuple[str, dict[str, Any]]]:
        order = {"table": "orders", "id": self.order,
                 "references": {"customer_id": "customers"}}
        return [
            ("record.insert", {"table": "customers", "id": self.customer,
                               "fields": {"name": "Ada"}}),
            ("record.insert", {**order, "fields": {"customer_id": "ada", "total": 42}}),
            ("record.insert", {**order, "fields": {"customer_id": "${steps.1.id}",
                                                   "total": 42}}),
            ("fs.write", {"path": f"receipts/{self.order}.txt",
                          "contents": f"order {self.order}: 42"}),
            ("effect.stage", {"channel": "hooks", "idempotency_key": self.key,
                              "payload": {"event": "order placed", "id": self.order}}),
        ]

    def check_answers(self, answers: list[StepResult]) -> None:
        assert [(r.step_id, r.ok) for r in answers] == \
            [(1, True), (2, False), (2, True), (3, True), (4, True)]
        failed = answers[1]
        assert (failed.category, failed.strategy) == ("foreign_key_violation",
                                                      Strategy.LOCAL_BACKTRACK)
        assert failed.hint == ('Field "customer_id" of table "orders" references "ada", which '
                               'is not in table "customers"; insert that row first or use an '
                               'existing id.')


def _committed(client: Client, table: str, rid: str) -> bool:
    tx = client.begin()
    found = tx.step("record.get", {"table": table, "id": rid}).ok
    tx.rollback()
    return found


# ---- leaving the block ------------------------------------------------------------------

def test_the_quickstart_without_a_commit_raises_step_failed_and_commits_nothing(
        svc, sandbox, hooks):
    q = Quickstart(sandbox)
    answers: list[StepResult] = []
    with Client(svc.target) as client:
        with pytest.raises(StepFailed) as failed:
            with client.transaction(agent_id="quickstart") as tx:
                for tool, args in q.steps():
                    answers.append(tx.step(tool, args))
        q.check_answers(answers)
        err = failed.value
        assert err.result == answers[1]
        assert (err.hint, err.category, err.strategy, err.code) == \
            (answers[1].hint, "foreign_key_violation", Strategy.LOCAL_BACKTRACK,
             grpc.StatusCode.OK)
        assert err.rollback is not None and err.rollback.rolled_back
        assert str(err) == f"step 2 (record.insert) failed: foreign_key_violation: {err.hint}"
        assert not q.receipt.exists()
        assert not _committed(client, "customers", q.customer)
        assert not _committed(client, "orders", q.order)
        history = client.history(tx.id)
    assert (history.status, history.steps_committed, history.effects) == \
        (TransactionStatus.ABORTED, 0, 0)
    assert history.reason == ("agenttx.client: a step failed and the block was left without "
                              "tx.commit()")
    # never committed, so never dispatched: the receiver has nothing under its key
    assert hooks.keys()[q.key] == 0


def test_the_quickstart_with_a_commit_after_the_recovery_commits_all_of_it(svc, sandbox, hooks):
    q = Quickstart(sandbox)
    with Client(svc.target) as client:
        with client.transaction(agent_id="quickstart") as tx:
            answers = [tx.step(tool, args) for tool, args in q.steps()]
            q.check_answers(answers)
            done = tx.commit()  # this code recovered (the retry): it says so
        assert done == CommitResult(True, 4, 1, (), False, "")
        assert done.status is TransactionStatus.COMMITTED
        assert q.receipt.read_text() == f"order {q.order}: 42"
        assert _committed(client, "customers", q.customer)
        assert _committed(client, "orders", q.order)
    [delivery] = [r for r in hooks.requests if r["headers"].get("Idempotency-Key") == q.key]
    assert json.loads(delivery["body"]) == {
        "channel": "hooks", "payload": {"event": "order placed", "id": q.order},
        "idempotency_key": q.key, "transaction_id": tx.id}


async def test_async_the_quickstart_without_a_commit_raises_step_failed_too(svc, sandbox,
                                                                           hooks):
    q = Quickstart(sandbox)
    answers: list[StepResult] = []
    async with AsyncClient(svc.target) as client:
        with pytest.raises(StepFailed) as failed:
            async with client.transaction(agent_id="quickstart") as tx:
                for tool, args in q.steps():
                    answers.append(await tx.step(tool, args))
        q.check_answers(answers)
        assert failed.value.result == answers[1]
        assert (await client.history(tx.id)).status is TransactionStatus.ABORTED
    assert not q.receipt.exists() and hooks.keys()[q.key] == 0


async def test_async_the_quickstart_with_a_commit_commits_all_of_it(svc, sandbox, hooks):
    q = Quickstart(sandbox)
    async with AsyncClient(svc.target) as client:
        async with client.transaction(agent_id="quickstart") as tx:
            answers = [await tx.step(tool, args) for tool, args in q.steps()]
            q.check_answers(answers)
            done = await tx.commit()
    assert (done.committed, done.steps_committed, done.effects_dispatched) == (True, 4, 1)
    assert q.receipt.exists() and hooks.keys()[q.key] == 1


def test_strict_raises_step_failed_at_the_failing_step_and_the_transaction_stays_open(svc,
                                                                                      uniq):
    with Client(svc.target) as client, client.transaction(strict=True) as tx:
        assert tx.step("kv.put", {"key": f"s-{uniq}", "value": 1}).ok
        with pytest.raises(StepFailed) as failed:
            tx.step("kv.get", {"key": f"missing-{uniq}"})
        assert (failed.value.result.step_id, failed.value.category, failed.value.strategy,
                failed.value.rollback) == (2, "no_data_found", Strategy.LOCAL_BACKTRACK, None)
        assert f"missing-{uniq}" in failed.value.hint
        assert (tx.finished, tx.next_step_id, tx.get().status) == \
            (False, 2, TransactionStatus.ACTIVE)
        assert tx.step("kv.get", {"key": f"s-{uniq}"}).output["value"] == 1  # goes on
        assert tx.commit().steps_committed == 2


async def test_async_strict_raises_at_the_failing_step(svc, uniq):
    async with AsyncClient(svc.target) as client, client.transaction(strict=True) as tx:
        with pytest.raises(StepFailed) as failed:
            await tx.step("kv.get", {"key": f"missing-{uniq}"})
        assert failed.value.result.status is StepStatus.ROLLBACK_TRIGGERED
        assert (await tx.get()).status is TransactionStatus.ACTIVE
        await tx.rollback()


def test_an_exception_leaving_the_block_still_aborts_and_is_not_replaced(svc, uniq):
    with Client(svc.target) as client:
        with pytest.raises(KeyError):
            with client.transaction() as tx:
                tx.step("kv.get", {"key": f"missing-{uniq}"})  # a failure, then an exception
                raise KeyError("mine")
        assert client.history(tx.id).reason == \
            "agenttx.client: exception KeyError left the transaction block"


def test_an_admin_rollback_meanwhile_raises_transaction_ended_on_leaving(svc, uniq):
    with Client(svc.target) as client, Client(svc.target) as operator:
        with pytest.raises(TransactionEnded) as left:
            with client.transaction(agent_id=f"rb-{uniq}") as tx:
                tx.step("kv.put", {"key": f"rb-{uniq}", "value": 1})
                operator.rollback(tx.id, reason="stuck on a lock")
        history = left.value.history
        assert history is not None and left.value.transaction_id == tx.id
        assert (history.status, history.reason, [s.tool for s in history.steps]) == \
            (TransactionStatus.ABORTED, "stuck on a lock", ["kv.put"])
        assert isinstance(left.value, NotFound)  # what code catching NotFound expects
        assert str(left.value) == (f"NOT_FOUND: transaction {tx.id} was ended by the service "
                                   "(ABORTED: stuck on a lock); nothing of it was committed")


def test_an_explicit_commit_of_an_ended_transaction_raises_transaction_ended(svc, uniq):
    with Client(svc.target) as client:
        tx = client.begin(policy={"max_local_depth": 0, "max_global_resets": 0})
        assert tx.step("kv.get", {"key": f"missing-{uniq}"}).ended
        with pytest.raises(TransactionEnded) as ended:
            tx.commit()
        assert ended.value.history is not None
        assert ended.value.history.status is TransactionStatus.ABORTED


# ---- input checks and closing -------------------------------------------------------------

def _bad_inputs(client: Any, tx: Any) -> list[tuple[Any, str]]:
    return [
        (lambda: tx.rollback(to_step=-1), "to_step must be an integer >= 1 (or None / 0 to "
                                          "abort), not -1"),
        (lambda: tx.rollback(to_step="2"), "to_step must be an integer >= 1 (or None / 0 to "
                                           "abort), not '2'"),
        (lambda: tx.rollback(to_step=True), "to_step must be an integer >= 1 (or None / 0 "
                                            "to abort), not True"),
        (lambda: tx.step("", {}), 'tool must be a non-empty string such as "kv.put", not \'\''),
        (lambda: tx.step("kv.put", [1, 2]), "args must be a dict (or a JSON object already "
                                            "encoded as a str), not list"),
        (lambda: tx.step("kv.put", {"v": float("nan")}), "args cannot be sent as JSON: Out of "
                                                         "range float values are not JSON "
                                                         "compliant"),
        (lambda: tx.step("kv.put", {}, context=None), "context must be a string, not NoneType"),
        (lambda: client.attach(tx.id, next_step_id=0), "next_step_id must be an integer >= 1, "
                                                       "not 0"),
        (lambda: client.get(""), "transaction_id must be a non-empty string (a transaction "
                                 "id), not ''"),
        (lambda: client.history(None), "transaction_id must be a non-empty string (a "
                                       "transaction id), not None"),
        (lambda: client.rollback(tx.id, to_step=-3), "to_step must be an integer >= 1 (or "
                                                     "None / 0 to abort), not -3"),
        (lambda: client.begin(metadata={"a": 1}), "metadata must map strings to strings"),
        (lambda: client.list_page(page_size=0), "page_size must be an integer >= 1, not 0"),
    ]


def test_the_client_refuses_bad_input_before_any_call():
    # nothing listens there: any call would end in UNAVAILABLE, not in these messages
    with Client(f"127.0.0.1:{free_port()}", timeout=2) as client:
        tx = client.attach(str(uuid.uuid4()), next_step_id=1)
        for call, message in _bad_inputs(client, tx):
            with pytest.raises(InvalidArgument) as err:
                call()
            assert err.value.details == message


async def test_the_async_client_refuses_the_same_bad_input_alike():
    async with AsyncClient(f"127.0.0.1:{free_port()}", timeout=2) as client:
        tx = await client.attach(str(uuid.uuid4()), next_step_id=1)
        for call, message in _bad_inputs(client, tx):
            with pytest.raises(InvalidArgument) as err:
                await call()
            assert err.value.details == message


def test_a_closed_client_refuses_calls(svc):
    client = Client(svc.target)
    client.begin().rollback()
    client.close()
    with pytest.raises(ValueError, match="^this agenttx Client is closed$"):
        client.begin()


async def test_a_closed_async_client_refuses_calls_too(svc):
    client = AsyncClient(svc.target)
    await (await client.begin()).rollback()
    await client.close()
    with pytest.raises(ValueError, match="^this agenttx AsyncClient is closed$"):
        await client.begin()


def test_committing_twice_says_it_was_already_committed(svc, uniq):
    with Client(svc.target) as client:
        tx = client.begin()
        tx.step("kv.put", {"key": f"twice-{uniq}", "value": 1})
        assert tx.commit().committed
        with pytest.raises(TransactionEnded) as again:
            tx.commit()
        assert str(again.value) == \
            f"NOT_FOUND: transaction {tx.id} was already committed (1 step)"
        assert again.value.history is not None and again.value.history.steps_committed == 1
