"""The built-ins (docs/tools.md#the-built-ins, seed 000): every built-in tool's exact output
and every failure's category and hint, against the real replicas, with files checked on disk
and committed data in etcd."""

from __future__ import annotations

import json
import os

import pytest

from agenttx.engine.state import from_json
from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import KEYS, expect_failure, output
from support.service import Agent


def _exact(resp: pb.ExecuteStepResponse, expected: dict) -> None:
    """The output as a JSON object with exactly these keys, in this order."""
    got = output(resp)
    assert got == expected
    assert list(got) == list(expected)


# ---- kv ------------------------------------------------------------------------------------

def test_kv_put_outputs_key_and_value_and_defaults_value_to_null(agent, uniq):
    _exact(agent.step("kv.put", {"key": f"k-{uniq}"}), {"key": f"k-{uniq}", "value": None})
    value = {"n": 1.5, "list": [1, "two", None, True], "nested": {"é": "ü"}}
    _exact(agent.step("kv.put", {"key": f"k-{uniq}", "value": value}),
           {"key": f"k-{uniq}", "value": value})
    _exact(agent.step("kv.get", {"key": f"k-{uniq}"}), {"key": f"k-{uniq}", "value": value})


async def test_kv_put_commits_the_json_value_to_etcd(a, store, uniq):
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"k-{uniq}"})
    agent.ok("kv.put", {"key": f"v-{uniq}", "value": [1, {"a": None}]})
    assert await store.get(KEYS.kv(f"k-{uniq}")) is None  # private until commit
    assert agent.commit().committed
    assert from_json((await store.get(KEYS.kv(f"k-{uniq}"))).value) == {"value": None}
    assert from_json((await store.get(KEYS.kv(f"v-{uniq}"))).value) == {"value": [1, {"a": None}]}


def test_kv_get_of_a_missing_key_is_no_data_found(agent, uniq):
    resp = agent.step("kv.get", {"key": f"missing-{uniq}"})
    expect_failure(resp, "no_data_found", f'"missing-{uniq}"', "kv")
    assert resp.status == pb.STEP_STATUS_ROLLBACK_TRIGGERED
    assert resp.next_step_id == 1


async def test_kv_delete_reports_deleted_and_commits_a_tombstone(a, b, store, uniq):
    seed = Agent(a)
    seed.ok("kv.put", {"key": f"del-{uniq}", "value": "old"})
    assert seed.commit().committed

    agent = Agent(b)
    _exact(agent.step("kv.delete", {"key": f"del-{uniq}"}), {"key": f"del-{uniq}", "deleted": True})
    # the tombstone hides the committed value from this transaction ...
    _exact(agent.step("kv.delete", {"key": f"del-{uniq}"}), {"key": f"del-{uniq}", "deleted": False})
    _exact(agent.step("kv.delete", {"key": f"never-{uniq}"}),
           {"key": f"never-{uniq}", "deleted": False})
    # ... but not from others until commit
    assert Agent(a).ok("kv.get", {"key": f"del-{uniq}"})["value"] == "old"
    assert await store.get(KEYS.kv(f"del-{uniq}")) is not None
    commit = agent.commit()
    assert (commit.committed, commit.steps_committed) == (True, 3)
    assert await store.get(KEYS.kv(f"del-{uniq}")) is None
    assert await store.get(KEYS.kv(f"never-{uniq}")) is None
    expect_failure(Agent(a).step("kv.get", {"key": f"del-{uniq}"}), "no_data_found", f"del-{uniq}")


def test_kv_get_after_kv_delete_in_the_same_transaction_is_no_data_found(a, uniq):
    seed = Agent(a)
    seed.ok("kv.put", {"key": f"del-{uniq}", "value": "old"})
    assert seed.commit().committed
    agent = Agent(a)
    agent.ok("kv.put", {"key": f"other-{uniq}", "value": 1})
    agent.ok("kv.delete", {"key": f"del-{uniq}"})
    resp = agent.step("kv.get", {"key": f"del-{uniq}"})
    expect_failure(resp, "no_data_found", f'"del-{uniq}"')
    # docs/recovery.md#3-dependencies-and-provenance: the step that deleted the key is the
    # culprit and is undone ...
    assert (resp.strategy, resp.rollback_to_step, resp.next_step_id) == \
        (pb.ROLLBACK_STRATEGY_DEPENDENCY_JUMP, 2, 2)
    # ... so the committed value is visible again
    assert agent.ok("kv.get", {"key": f"del-{uniq}"})["value"] == "old"


def test_kv_put_after_delete_in_the_same_transaction_is_visible(agent, uniq):
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 1})
    agent.ok("kv.delete", {"key": f"k-{uniq}"})
    agent.ok("kv.put", {"key": f"k-{uniq}", "value": 2})
    assert agent.ok("kv.get", {"key": f"k-{uniq}"})["value"] == 2


# ---- records -------------------------------------------------------------------------------

def test_record_insert_and_get_output_the_row_with_table_and_id(agent, uniq):
    table = f"people_{uniq}"
    fields = {"name": "Zoë", "age": 41, "tags": ["a"]}
    _exact(agent.step("record.insert", {"table": table, "id": "p1", "fields": fields}),
           {"table": table, "id": "p1", "fields": fields})
    _exact(agent.step("record.insert", {"table": table, "id": 2}),
           {"table": table, "id": 2, "fields": {}})
    _exact(agent.step("record.get", {"table": table, "id": "p1"}),
           {"table": table, "id": "p1", "fields": fields})
    _exact(agent.step("record.get", {"table": table, "id": 2}), {"table": table, "id": 2, "fields": {}})


def test_record_get_of_a_missing_row_is_no_data_found(agent, uniq):
    expect_failure(agent.step("record.get", {"table": f"t_{uniq}", "id": 5}), "no_data_found",
                   f"t_{uniq}", "5")


async def test_record_ids_keep_their_json_type(a, store, uniq):
    table = f"t_{uniq}"
    agent = Agent(a)
    agent.ok("record.insert", {"table": table, "id": 7, "fields": {"kind": "number"}})
    agent.ok("record.insert", {"table": table, "id": "7", "fields": {"kind": "string"}})
    _exact(agent.step("record.get", {"table": table, "id": 7}),
           {"table": table, "id": 7, "fields": {"kind": "number"}})
    _exact(agent.step("record.get", {"table": table, "id": "7"}),
           {"table": table, "id": "7", "fields": {"kind": "string"}})
    assert agent.commit().committed
    assert from_json((await store.get(KEYS.record(table, 7))).value) == {"fields": {"kind": "number"}}
    assert from_json((await store.get(KEYS.record(table, "7"))).value) == \
        {"fields": {"kind": "string"}}
    reader = Agent(a)
    assert reader.ok("record.get", {"table": table, "id": "7"})["fields"] == {"kind": "string"}
    expect_failure(reader.step("record.get", {"table": table, "id": 8}), "no_data_found")
    expect_failure(reader.step("record.insert", {"table": table, "id": 7}), "unique_violation")


def test_record_insert_duplicate_is_unique_violation(a, uniq):
    table = f"dup_{uniq}"
    seed = Agent(a)
    seed.ok("record.insert", {"table": table, "id": 1})
    assert seed.commit().committed
    agent = Agent(a)
    expect_failure(agent.step("record.insert", {"table": table, "id": 1}), "unique_violation",
                   f'"{table}"', '"1"')
    agent.ok("record.insert", {"table": table, "id": "own"})
    expect_failure(agent.step("record.insert", {"table": table, "id": "own", "fields": {"x": 1}}),
                   "unique_violation", f'"{table}"', '"own"')


@pytest.mark.parametrize("fields", [{}, {"owner": None}, {"other": 1}])
def test_record_insert_with_a_missing_referenced_field_is_not_null_violation(agent, uniq, fields):
    resp = agent.step("record.insert", {"table": f"pets_{uniq}", "id": 1, "fields": fields,
                                        "references": {"owner": f"people_{uniq}"}})
    expect_failure(resp, "not_null_violation", '"owner"', f'"pets_{uniq}"')


def test_record_insert_with_a_missing_referenced_row_is_foreign_key_violation(agent, uniq):
    resp = agent.step("record.insert", {"table": f"pets_{uniq}", "id": 1,
                                        "fields": {"owner": 42},
                                        "references": {"owner": f"people_{uniq}"}})
    expect_failure(resp, "foreign_key_violation", '"owner"', f'"pets_{uniq}"', '"42"',
                   f'"people_{uniq}"')


def test_foreign_keys_resolve_against_committed_rows_and_own_live_inserts(a, b, uniq):
    people, pets = f"people_{uniq}", f"pets_{uniq}"
    seed = Agent(a)
    seed.ok("record.insert", {"table": people, "id": "alice"})
    assert seed.commit().committed

    agent = Agent(b)
    refs = {"owner": people}
    _exact(agent.step("record.insert", {"table": pets, "id": 1, "fields": {"owner": "alice"},
                                        "references": refs}),
           {"table": pets, "id": 1, "fields": {"owner": "alice"}})
    agent.ok("record.insert", {"table": people, "id": 2})  # same transaction, not committed
    agent.ok("record.insert", {"table": pets, "id": 2, "fields": {"owner": 2}, "references": refs})
    # the number 2 is not the string "2"
    expect_failure(agent.step("record.insert", {"table": pets, "id": 3, "fields": {"owner": "2"},
                                                "references": refs}),
                   "foreign_key_violation", f'"{people}"')
    # an insert in another, uncommitted transaction is not visible
    other = Agent(a)
    other.ok("record.insert", {"table": people, "id": "bob"})
    expect_failure(agent.step("record.insert", {"table": pets, "id": 4, "fields": {"owner": "bob"},
                                                "references": refs}),
                   "foreign_key_violation", '"bob"')
    assert agent.commit().steps_committed == 3


def test_record_insert_accepts_64_references_and_refuses_65(a, uniq):
    people = f"people_{uniq}"
    seed = Agent(a)
    seed.ok("record.insert", {"table": people, "id": 1})
    assert seed.commit().committed
    agent = Agent(a)
    row = {"table": f"t_{uniq}", "id": 1, "fields": {f"f{i}": 1 for i in range(65)}}
    resp = agent.step("record.insert", {**row, "references": {f"f{i}": people for i in range(65)}})
    expect_failure(resp, "program_limit_exceeded", "65", "64")
    agent.ok("record.insert", {**row, "references": {f"f{i}": people for i in range(64)}})


@pytest.mark.parametrize("table", ["bad-name", "", "a" * 129, "ta ble", "t/../x", "tä"])
def test_record_tools_reject_a_bad_table_name_as_invalid_name(agent, table):
    expect_failure(agent.step("record.insert", {"table": table, "id": 1}), "invalid_name")
    expect_failure(agent.step("record.get", {"table": table, "id": 1}), "invalid_name")


def test_record_insert_rejects_a_bad_referenced_table_name(agent, uniq):
    expect_failure(agent.step("record.insert", {"table": f"t_{uniq}", "id": 1,
                                                "fields": {"o": 1}, "references": {"o": "x-y"}}),
                   "invalid_name", '"x-y"')


def test_a_table_name_of_128_characters_is_valid(agent):
    table = "T" * 128
    agent.ok("record.insert", {"table": table, "id": os.urandom(4).hex()})


# ---- argument validation (serde style) -----------------------------------------------------

@pytest.mark.parametrize(("tool", "args", "field"), [
    ("kv.put", {"value": 1}, "key"),
    ("kv.get", {}, "key"),
    ("kv.delete", {}, "key"),
    ("record.insert", {"id": 1}, "table"),
    ("record.insert", {"table": "t"}, "id"),
    ("record.get", {"table": "t"}, "id"),
    ("fs.write", {"path": "p"}, "contents"),
    ("fs.read", {}, "path"),
    ("effect.stage", {"payload": 1}, "channel"),
])
def test_a_missing_argument_is_invalid_parameter_value_naming_it(agent, tool, args, field):
    expect_failure(agent.step(tool, args), "invalid_parameter_value", f'"{field}"', "missing")


@pytest.mark.parametrize(("tool", "args", "field"), [
    ("kv.put", {"key": 5}, "key"),
    ("kv.get", {"key": ["a"]}, "key"),
    ("record.insert", {"table": "t", "id": True}, "id"),
    ("record.insert", {"table": "t", "id": 1, "fields": [1]}, "fields"),
    ("record.insert", {"table": "t", "id": 1, "references": "x"}, "references"),
    ("record.get", {"table": 1, "id": 1}, "table"),
    ("fs.write", {"path": "p", "contents": {"a": 1}}, "contents"),
    ("effect.stage", {"channel": "log", "idempotency_key": 9}, "idempotency_key"),
])
def test_an_argument_of_the_wrong_type_is_invalid_parameter_value_naming_it(
        agent, tool, args, field):
    expect_failure(agent.step(tool, args), "invalid_parameter_value", f'"{field}"', "wrong type")


@pytest.mark.parametrize(("args", "field"), [
    ({"fields": {"o": 1}, "references": {"o": 5}}, "references.o"),
    ({"fields": {"o": [1]}, "references": {"o": "people"}}, "fields.o"),
    ({"fields": {"o": {"id": 1}}, "references": {"o": "people"}}, "fields.o"),
])
def test_a_nested_argument_of_the_wrong_type_is_invalid_parameter_value_naming_it(
        agent, uniq, args, field):
    resp = agent.step("record.insert", {"table": f"t_{uniq}", "id": 1, **args})
    expect_failure(resp, "invalid_parameter_value", f'"{field}"', "wrong type")


@pytest.mark.parametrize("tool", ["kv.put", "kv.get", "record.get", "fs.read", "effect.stage"])
def test_an_unknown_argument_is_invalid_parameter_value_naming_it(agent, tool):
    expect_failure(agent.step(tool, {"surprise": 1}), "invalid_parameter_value", '"surprise"')


@pytest.mark.parametrize(("raw", "line", "column"), [
    ('{"key": }', 1, 9),
    ('{"key": "k",}', 1, 13),
    ('{"key" "k"}', 1, 8),
    ('{\n  "key": "k"\n  "value": 1\n}', 3, 3),
    ('{\n  "key":\n}', 3, 1),
    ('{"key": "k"} x', 1, 14),
])
def test_malformed_json_is_invalid_text_representation_with_line_and_column(
        agent, raw, line, column):
    resp = agent.step("kv.put", raw=raw)
    expect_failure(resp, "invalid_text_representation", f"line {line}", f"column {column}")


def test_an_unknown_tool_is_undefined_function_suggesting_the_closest_name(agent):
    expect_failure(agent.step("kv.pt", {"key": "k"}), "undefined_function", '"kv.pt"', '"kv.put"')
    expect_failure(agent.step("record_insert", {}), "undefined_function", '"record.insert"')
    expect_failure(agent.step("fs.wirte", {}), "undefined_function", '"fs.write"')


# ---- files ---------------------------------------------------------------------------------

def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".agenttx-" in p.name)


def test_fs_write_outputs_the_utf8_length_and_writes_the_file(agent, sandbox, uniq):
    contents = "héllo wörld € 🎉\nline 2"
    path = f"docs-{uniq}/ünï.txt"
    _exact(agent.step("fs.write", {"path": path, "contents": contents}),
           {"path": path, "bytes": len(contents.encode())})
    assert len(contents.encode()) != len(contents)
    target = sandbox / path
    assert target.read_bytes() == contents.encode()
    assert _leftovers(target.parent) == []  # temp file renamed into place, not left behind
    _exact(agent.step("fs.read", {"path": path}), {"path": path, "contents": contents})
    _exact(agent.step("fs.write", {"path": f"empty-{uniq}", "contents": ""}),
           {"path": f"empty-{uniq}", "bytes": 0})
    assert (sandbox / f"empty-{uniq}").read_bytes() == b""
    assert agent.commit().steps_committed == 3
    assert target.read_bytes() == contents.encode()


def test_fs_write_overwrites_a_file_and_keeps_it_after_commit(agent, sandbox, uniq):
    target = sandbox / f"over-{uniq}.txt"
    target.write_bytes(b"before")
    old_handle = sandbox / f"over-{uniq}.hardlink"
    os.link(target, old_handle)
    inode = target.stat().st_ino
    _exact(agent.step("fs.write", {"path": f"over-{uniq}.txt", "contents": "after"}),
           {"path": f"over-{uniq}.txt", "bytes": 5})
    assert target.read_bytes() == b"after"
    # atomic replace: a new inode was renamed over the name; the old file was never
    # truncated or rewritten in place (a reader holding it still sees "before")
    assert target.stat().st_ino != inode
    assert old_handle.read_bytes() == b"before"
    assert agent.commit().committed
    assert target.read_bytes() == b"after"
    assert [n for n in _leftovers(sandbox) if uniq in n] == []


def test_fs_write_twice_to_one_path_then_more_steps_and_commit(agent, sandbox, uniq):
    path = f"twice-{uniq}.txt"
    agent.ok("fs.write", {"path": path, "contents": "one"})
    agent.ok("fs.write", {"path": path, "contents": "two"})
    _exact(agent.step("fs.read", {"path": path}), {"path": path, "contents": "two"})
    assert agent.commit().steps_committed == 3
    assert (sandbox / path).read_text() == "two"


def test_fs_read_outputs_the_contents(agent, sandbox, uniq):
    (sandbox / f"read-{uniq}.txt").write_text("committed ✓", encoding="utf-8")
    _exact(agent.step("fs.read", {"path": f"read-{uniq}.txt"}),
           {"path": f"read-{uniq}.txt", "contents": "committed ✓"})
    agent.ok("fs.write", {"path": f"read-{uniq}.txt", "contents": "mine"})
    _exact(agent.step("fs.read", {"path": f"./read-{uniq}.txt"}),
           {"path": f"./read-{uniq}.txt", "contents": "mine"})


def test_fs_read_of_a_missing_file_is_undefined_file(agent, uniq):
    expect_failure(agent.step("fs.read", {"path": f"nope-{uniq}.txt"}), "undefined_file",
                   f'"nope-{uniq}.txt"')


def test_fs_write_is_locked_against_another_transaction(a, b, sandbox, uniq):
    first = Agent(a)
    first.ok("fs.write", {"path": f"locked-{uniq}.txt", "contents": "first"})
    second = Agent(b)
    expect_failure(second.step("fs.write", {"path": f"locked-{uniq}.txt", "contents": "second"}),
                   "lock_not_available", f"locked-{uniq}.txt")
    assert (sandbox / f"locked-{uniq}.txt").read_text() == "first"
    assert first.commit().committed
    second.ok("fs.write", {"path": f"locked-{uniq}.txt", "contents": "second"})
    assert (sandbox / f"locked-{uniq}.txt").read_text() == "second"


# ---- effects -------------------------------------------------------------------------------

def test_effect_stage_outputs_staged_with_a_generated_or_given_key(agent, uniq):
    generated = output(agent.step("effect.stage", {"channel": "log", "payload": {"n": 1}}))
    assert list(generated) == ["staged", "channel", "idempotency_key"]
    assert generated["staged"] is True and generated["channel"] == "log"
    assert isinstance(generated["idempotency_key"], str) and generated["idempotency_key"]
    again = output(agent.step("effect.stage", {"channel": "log"}))
    assert again["idempotency_key"] != generated["idempotency_key"]
    _exact(agent.step("effect.stage", {"channel": "log", "payload": [1], "idempotency_key": uniq}),
           {"staged": True, "channel": "log", "idempotency_key": uniq})


def test_effect_stage_to_an_unknown_channel_is_undefined_object(agent):
    expect_failure(agent.step("effect.stage", {"channel": "sms", "payload": "hi"}),
                   "undefined_object", '"sms"', '"log"')


def test_committed_effects_are_dispatched_with_their_keys(a, replicas, uniq):
    agent = Agent(a)
    agent.ok("effect.stage", {"channel": "log", "payload": {"to": uniq}, "idempotency_key": uniq})
    commit = agent.commit()
    assert (commit.committed, commit.effects_dispatched, list(commit.dispatch_errors)) == \
        (True, 1, [])
    delivered = [r for p in replicas for r in p.logs()
                 if r.get("msg") == "effect" and r.get("idempotency_key") == uniq]
    assert len(delivered) == 1
    assert json.dumps(delivered[0].get("payload")) == json.dumps({"to": uniq})
