"""The history records (engine/history.py) without etcd: texts cut to 4096 bytes of UTF-8
ending with "…", the codec, the Puts a state change folds in, and what one response
carries when a transaction sent more steps than fit."""

from __future__ import annotations

import pytest

from agenttx.contracts.layout import Keys
from agenttx.engine.history import (
    ELLIPSIS,
    TEXT_BYTES,
    Ending,
    HistoryEnd,
    HistoryEntry,
    HistoryWriter,
    decode_end,
    decode_entry,
    encode_end,
    encode_entry,
    fit,
    truncate_utf8,
)
from agenttx.engine.ops import StepChanges, step_plan
from agenttx.engine.state import ACTIVE, TxHeader, TxPolicy, decode_header, encode_header

KEYS = Keys("/p")
TX = "3f1c2b9e-0000-4000-8000-000000000001"


def header(**kw) -> TxHeader:
    base = dict(id=TX, principal="alice", agent_id="a", status=ACTIVE,
                policy=TxPolicy(3, 1, 2.0, 900, "/sandbox", "server-default"),
                created_at=1.0, updated_at=1.0)
    return TxHeader(**{**base, **kw})


def test_a_short_text_is_kept_as_it_is():
    assert truncate_utf8("x" * TEXT_BYTES) == "x" * TEXT_BYTES


@pytest.mark.parametrize("char", ["x", "é", "€", "😀"])
def test_a_long_text_is_cut_at_a_character_and_ends_with_an_ellipsis(char):
    cut = truncate_utf8(char * 5000)
    raw = cut.encode()
    assert cut.endswith(ELLIPSIS) and len(raw) <= TEXT_BYTES
    assert len(raw) > TEXT_BYTES - len(char.encode()) - len(ELLIPSIS.encode())
    assert set(cut[:-1]) == {char}  # no character cut in half


def test_entries_and_end_records_survive_their_codec():
    entry = HistoryEntry(2, "kv.get", "ROLLBACK_TRIGGERED", "no_data_found", "Key …",
                         "LOCAL_BACKTRACK", 12.5, '{"key": "k"}', "")
    assert decode_entry(encode_entry(entry)) == entry
    end = HistoryEnd("ABORTED", "agent", "alice", 1.0, 2.0, "ops", "why", 0, 0)
    assert decode_end(encode_end(end)) == end


def test_the_entry_helper_cuts_arguments_and_output():
    e = HistoryEntry.of(1, "kv.put", "SUCCESS", arguments_json="a" * 9000,
                        output_json="b" * 9000)
    assert len(e.arguments_json.encode()) <= TEXT_BYTES and e.arguments_json.endswith(ELLIPSIS)
    assert len(e.output_json.encode()) <= TEXT_BYTES and e.output_json.endswith(ELLIPSIS)


async def test_an_entry_is_one_key_per_step_sent_on_the_lease_the_header_pins():
    leases = iter([41, 42])

    async def lease_id() -> int:
        return next(leases)

    writer = HistoryWriter(KEYS, lease_id)
    entry = HistoryEntry.of(1, "kv.put", "SUCCESS", arguments_json="{}")
    put, h1 = await writer.entry(header(), entry)
    assert (put.key, put.lease) == (KEYS.history_step(TX, 0), 41)
    assert (h1.history_seq, h1.history_lease) == (1, 41)
    put2, h2 = await writer.entry(h1, entry)  # the pin holds: no new lease asked for
    assert (put2.key, put2.lease, h2.history_seq) == (KEYS.history_step(TX, 1), 41, 2)
    assert decode_header(encode_header(h2)) == h2
    end = await writer.end(h2, Ending("ABORTED", "bob", "r" * 9000))
    assert (end.key, end.lease) == (KEYS.history_end(TX), 42)  # the current bucket's lease
    record = decode_end(end.value)
    assert (record.principal, record.ended_by, record.reason.endswith(ELLIPSIS)) == \
        ("alice", "bob", True)


def test_a_step_plan_folds_its_entry_into_the_same_transaction():
    h = header(next_step_id=5)
    put = HistoryWriter(KEYS, lambda: None).rewrite(  # type: ignore[arg-type]
        h, 7, HistoryEntry.of(5, "kv.put", "SUCCESS", arguments_json="{}"))
    plan = step_plan(KEYS, h, 9, header(next_step_id=5, attempts=1), None, "",
                     StepChanges(observed={}, entries={}), history=[put])
    assert put in plan.success and len(plan.compares) == 1  # the header's CAS only


def test_history_fits_one_response_shortening_texts_then_keeping_the_newest():
    entries = [HistoryEntry(i, "kv.put", "SUCCESS", "", "", "NONE", float(i), "a" * 4000,
                            "b" * 4000) for i in range(1, 101)]
    assert fit(entries, 10_000_000) == entries
    shortened = fit(entries, 200_000)
    assert [e.step_id for e in shortened] == list(range(1, 101))
    assert all(len(e.arguments_json.encode()) < 1000 and e.arguments_json.endswith(ELLIPSIS)
               for e in shortened)
    newest = fit(entries, 5_000)
    assert newest and newest[-1].step_id == 100 and newest[0].step_id > 1
    assert [e.step_id for e in newest] == list(range(newest[0].step_id, 101))
