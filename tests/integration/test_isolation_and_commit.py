"""Isolation and commit (docs/architecture.md#isolation-and-commit-serializable), against two
replicas and the real etcd underneath.

kv/record writes stay private until commit; commit is one compare-and-swap over every
written key's observed mod_revision; a lost CAS answers ABORTED after compensating the
transaction (files restored on disk) and ends it; read-only keys never conflict.
"""

from __future__ import annotations

import grpc

from agenttx.engine.state import from_json
from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import KEYS, TIMEOUT_S, expect_error, expect_failure, get
from support.service import Agent

ABORTED = grpc.StatusCode.ABORTED
DATA_PREFIX = f"{KEYS.prefix}/data/".encode()          # store/layout.py
FS_LOCKS_PREFIX = f"{KEYS.prefix}/locks/fs/".encode()
NOT_FOUND = grpc.StatusCode.NOT_FOUND


async def _value(store, key: str):
    kv = await store.get(KEYS.kv(key))
    return None if kv is None else from_json(kv.value)["value"]


async def test_kv_writes_are_invisible_to_others_until_commit(a, b, store, uniq):
    writer, reader = Agent(a), Agent(b)
    writer.ok("kv.put", {"key": f"k-{uniq}", "value": "mine"})
    assert writer.ok("kv.get", {"key": f"k-{uniq}"}, stub=b)["value"] == "mine"  # own write
    expect_failure(reader.step("kv.get", {"key": f"k-{uniq}"}), "no_data_found", f"k-{uniq}")
    assert await store.get(KEYS.kv(f"k-{uniq}")) is None
    assert writer.commit().committed
    assert await _value(store, f"k-{uniq}") == "mine"
    # the same reader now sees the committed value (committed data + own live writes)
    assert reader.ok("kv.get", {"key": f"k-{uniq}"})["value"] == "mine"
    assert Agent(a).ok("kv.get", {"key": f"k-{uniq}"})["value"] == "mine"


async def test_overwrites_and_deletes_are_invisible_to_others_until_commit(a, b, store, uniq):
    seed = Agent(a)
    seed.ok("kv.put", {"key": f"o-{uniq}", "value": 1})
    seed.ok("kv.put", {"key": f"d-{uniq}", "value": 1})
    assert seed.commit().committed
    writer = Agent(b)
    writer.ok("kv.put", {"key": f"o-{uniq}", "value": 2})
    writer.ok("kv.delete", {"key": f"d-{uniq}"})
    other = Agent(a)
    assert other.ok("kv.get", {"key": f"o-{uniq}"})["value"] == 1
    assert other.ok("kv.get", {"key": f"d-{uniq}"})["value"] == 1
    assert writer.commit().committed
    assert await _value(store, f"o-{uniq}") == 2
    assert await store.get(KEYS.kv(f"d-{uniq}")) is None
    assert other.ok("kv.get", {"key": f"o-{uniq}"})["value"] == 2
    expect_failure(other.step("kv.get", {"key": f"d-{uniq}"}), "no_data_found")


async def test_record_writes_are_invisible_to_others_until_commit(a, b, store, uniq):
    table = f"orders_{uniq}"
    writer, reader = Agent(a), Agent(b)
    writer.ok("record.insert", {"table": table, "id": 1, "fields": {"total": 9.5}})
    expect_failure(reader.step("record.get", {"table": table, "id": 1}), "no_data_found", table)
    # nor can another transaction reference it as a foreign key
    expect_failure(reader.step("record.insert", {
        "table": f"lines_{uniq}", "id": 1, "fields": {"order": 1},
        "references": {"order": table}}), "foreign_key_violation", table)
    assert await store.get(KEYS.record(table, 1)) is None
    assert writer.commit().committed
    assert from_json((await store.get(KEYS.record(table, 1))).value) == {"fields": {"total": 9.5}}
    assert reader.ok("record.get", {"table": table, "id": 1})["fields"] == {"total": 9.5}


async def test_commit_conflict_aborts_and_compensates_fs_writes(a, b, store, sandbox, uniq):
    existing, created = sandbox / f"existing-{uniq}.txt", sandbox / f"new-{uniq}/created.txt"
    existing.write_bytes(b"original bytes \xe2\x9c\x93")
    seed = Agent(a)
    seed.ok("kv.put", {"key": f"shared-{uniq}", "value": 0})
    assert seed.commit().committed

    loser, winner = Agent(a), Agent(b)
    loser.ok("kv.put", {"key": f"shared-{uniq}", "value": "loser"})
    loser.ok("fs.write", {"path": f"existing-{uniq}.txt", "contents": "changed by loser"})
    loser.ok("fs.write", {"path": f"new-{uniq}/created.txt", "contents": "created by loser"})
    loser.ok("kv.put", {"key": f"private-{uniq}", "value": "never committed"})
    assert existing.read_text() == "changed by loser" and created.exists()

    winner.ok("kv.put", {"key": f"shared-{uniq}", "value": "winner"})
    assert winner.commit().committed

    expect_error(a.CommitTransaction, pb.CommitTransactionRequest(transaction_id=loser.tx),
                 ABORTED, "conflict", f"shared-{uniq}")
    assert existing.read_bytes() == b"original bytes \xe2\x9c\x93"
    assert not created.exists()
    assert [p.name for p in existing.parent.iterdir() if uniq in p.name and ".agenttx-" in p.name] \
        == []
    assert await _value(store, f"shared-{uniq}") == "winner"
    assert await store.get(KEYS.kv(f"private-{uniq}")) is None
    assert await store.get_prefix(KEYS.tx_prefix(loser.tx)) == []
    for stub in (a, b):
        expect_error(stub.GetTransaction, pb.GetTransactionRequest(transaction_id=loser.tx),
                     NOT_FOUND, loser.tx)
        expect_error(stub.CommitTransaction, pb.CommitTransactionRequest(transaction_id=loser.tx),
                     NOT_FOUND, loser.tx)
    # its fs locks were released: another transaction may write the same path
    Agent(b).ok("fs.write", {"path": f"existing-{uniq}.txt", "contents": "free again"})


async def test_commit_conflict_on_a_key_absent_when_first_touched(a, b, store, uniq):
    first, second = Agent(a), Agent(b)
    first.ok("kv.put", {"key": f"fresh-{uniq}", "value": 1})
    second.ok("kv.put", {"key": f"fresh-{uniq}", "value": 2})
    assert second.commit().committed
    expect_error(a.CommitTransaction, pb.CommitTransactionRequest(transaction_id=first.tx),
                 ABORTED, f"fresh-{uniq}")
    assert await _value(store, f"fresh-{uniq}") == 2


async def test_commit_conflict_on_a_record_row(a, b, store, uniq):
    table = f"t_{uniq}"
    first, second = Agent(a), Agent(b)
    first.ok("record.insert", {"table": table, "id": "r1", "fields": {"by": "first"}})
    second.ok("record.insert", {"table": table, "id": "r1", "fields": {"by": "second"}})
    assert second.commit().committed
    expect_error(b.CommitTransaction, pb.CommitTransactionRequest(transaction_id=first.tx),
                 ABORTED, table, "r1")
    assert from_json((await store.get(KEYS.record(table, "r1"))).value)["fields"] == \
        {"by": "second"}


async def test_a_transaction_whose_read_changed_before_commit_is_aborted(a, b, store, uniq):
    """Serializable (docs/architecture.md#isolation-and-commit-serializable): a key the
    transaction only read is validated at commit too."""
    seed = Agent(a)
    seed.ok("kv.put", {"key": f"read-{uniq}", "value": "v1"})
    assert seed.commit().committed
    reader = Agent(a)
    assert reader.ok("kv.get", {"key": f"read-{uniq}"})["value"] == "v1"
    reader.ok("kv.put", {"key": f"out-{uniq}", "value": "${steps.1.value}"})
    changer = Agent(b)
    changer.ok("kv.put", {"key": f"read-{uniq}", "value": "v2"})
    assert changer.commit().committed
    err = expect_error(a.CommitTransaction, pb.CommitTransactionRequest(transaction_id=reader.tx),
                       grpc.StatusCode.ABORTED, f'kv key "read-{uniq}"')
    assert "compensated" in err.details()
    assert await _value(store, f"out-{uniq}") is None  # nothing of the reader applied
    assert await _value(store, f"read-{uniq}") == "v2"
    expect_error(a.GetTransaction, pb.GetTransactionRequest(transaction_id=reader.tx),
                 NOT_FOUND)


async def test_commit_writes_exactly_the_live_writes_and_removes_the_transaction(
        a, b, store, sandbox, uniq):
    table = f"t_{uniq}"
    seed = Agent(a)
    seed.ok("kv.put", {"key": f"gone-{uniq}", "value": 1})
    seed.ok("kv.put", {"key": f"kept-{uniq}", "value": "untouched"})
    assert seed.commit().committed

    agent = Agent(b)
    agent.ok("kv.put", {"key": f"k1-{uniq}", "value": {"a": [1, 2]}})
    agent.ok("kv.put", {"key": f"k2-{uniq}", "value": "first"})
    agent.ok("kv.put", {"key": f"k2-{uniq}", "value": "last"})
    agent.ok("kv.delete", {"key": f"gone-{uniq}"})
    agent.ok("kv.get", {"key": f"kept-{uniq}"})
    agent.ok("record.insert", {"table": table, "id": 1, "fields": {"n": 1}})
    agent.ok("record.insert", {"table": table, "id": "1", "fields": {"s": "1"}})
    agent.ok("fs.write", {"path": f"commit-{uniq}.txt", "contents": "on disk"})
    agent.ok("kv.put", {"key": f"undone-{uniq}", "value": "x"})
    assert agent.rollback(to_step=9).rolled_back
    assert [kv.key for kv in await store.get_prefix(KEYS.tx_prefix(agent.tx))] != []
    before = {kv.key: kv.mod_revision for kv in await store.get_prefix(DATA_PREFIX)}

    commit = agent.commit()
    assert (commit.committed, commit.steps_committed) == (True, 8)

    after = {kv.key: kv for kv in await store.get_prefix(DATA_PREFIX)}
    changed = {k for k, kv in after.items() if before.get(k) != kv.mod_revision}
    assert changed == {KEYS.kv(f"k1-{uniq}"), KEYS.kv(f"k2-{uniq}"), KEYS.record(table, 1),
                       KEYS.record(table, "1")}
    assert set(before) - set(after) == {KEYS.kv(f"gone-{uniq}")}
    revisions = {after[k].mod_revision for k in changed}
    assert len(revisions) == 1  # one etcd transaction
    assert from_json(after[KEYS.kv(f"k1-{uniq}")].value) == {"value": {"a": [1, 2]}}
    assert from_json(after[KEYS.kv(f"k2-{uniq}")].value) == {"value": "last"}
    assert from_json(after[KEYS.record(table, 1)].value) == {"fields": {"n": 1}}
    assert from_json(after[KEYS.record(table, "1")].value) == {"fields": {"s": "1"}}
    assert from_json(after[KEYS.kv(f"kept-{uniq}")].value) == {"value": "untouched"}
    assert KEYS.kv(f"undone-{uniq}") not in after
    assert await store.get_prefix(KEYS.tx_prefix(agent.tx)) == []
    assert [kv.key for kv in await store.get_prefix(FS_LOCKS_PREFIX)
            if f"commit-{uniq}".encode() in kv.key] == []
    assert (sandbox / f"commit-{uniq}.txt").read_text() == "on disk"
    expect_error(a.GetTransaction, pb.GetTransactionRequest(transaction_id=agent.tx),
                 NOT_FOUND, agent.tx)


def test_steps_committed_counts_live_steps_only(a, uniq):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"a-{uniq}"})
    expect_failure(agent.step("kv.get", {"key": f"nope-{uniq}"}), "no_data_found")  # not live
    agent.ok("kv.put", {"key": f"b-{uniq}"})
    agent.ok("effect.stage", {"channel": "log"})
    agent.ok("kv.put", {"key": f"c-{uniq}"})
    assert agent.rollback(to_step=4).compensations_run == 1
    assert get(a, agent.tx).next_step_id == 4
    commit = a.CommitTransaction(pb.CommitTransactionRequest(transaction_id=agent.tx),
                                 timeout=TIMEOUT_S)
    assert (commit.committed, commit.steps_committed, commit.effects_dispatched) == (True, 3, 1)


def test_an_empty_transaction_commits_zero_steps(a):
    commit = Agent(a).commit()
    assert (commit.committed, commit.steps_committed, commit.effects_dispatched) == (True, 0, 0)
