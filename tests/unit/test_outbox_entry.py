"""The outbox entry and dead letter records (agenttx.contracts.outbox), the idempotency
key rule, and which delivery failures are permanent (agenttx.effects.delivery). No I/O."""

from __future__ import annotations

import json

import pytest

from agenttx.contracts.outbox import (
    KIND_DEFERRED,
    KIND_EFFECT,
    MAX_ERROR_CHARS,
    DeadLetter,
    OutboxEntry,
    decode_dead_letter,
    decode_entry,
    effect_entry,
    encode_dead_letter,
    encode_entry,
    idempotency_key_problem,
    reservation_value,
)
from agenttx.effects.delivery import (
    TRANSIENT_HTTP_4XX,
    DeliveryError,
    http_status_is_permanent,
    smtp_code_is_permanent,
)

# ---- the codec ---------------------------------------------------------------------------

def test_an_effect_entry_round_trips_with_readable_field_names():
    entry = effect_entry("hooks", {"order": 7, "note": "é"}, "order-7", "tx-1", 3, now=100.0,
                         owner="billing-agent", claimed_by="replica-a", claim_s=30.0)
    assert entry == OutboxEntry(kind=KIND_EFFECT, idempotency_key="order-7",
                                transaction_id="tx-1", seq=3, created_at=100.0,
                                owner="billing-agent", channel="hooks",
                                payload={"order": 7, "note": "é"}, next_attempt_at=100.0,
                                claimed_by="replica-a", claim_until=130.0)
    raw = encode_entry(entry)
    assert json.loads(raw) == {
        "kind": "effect", "idempotency_key": "order-7", "transaction_id": "tx-1", "seq": 3,
        "created_at": 100.0, "owner": "billing-agent", "attempts": 0,
        "next_attempt_at": 100.0, "claimed_by": "replica-a", "claim_until": 130.0,
        "last_error": "", "channel": "hooks", "payload": {"order": 7, "note": "é"}}
    assert decode_entry(raw) == entry


def test_an_unclaimed_entry_has_no_claim_deadline():
    entry = effect_entry("log", None, "k", "tx", 1, now=5.0, claim_s=30.0)
    assert (entry.claimed_by, entry.claim_until) == ("", 0.0)


def test_a_deferred_entry_carries_the_tool_call_and_names_the_tool():
    entry = OutboxEntry(kind=KIND_DEFERRED, idempotency_key="mail-1", transaction_id="tx-2",
                        seq=1, created_at=1.0, tool="mail.send_email",
                        toolset="team-a/mailer", arguments={"to": "a@b.c", "n": [1, 2]})
    assert entry.target == "mail.send_email"
    doc = json.loads(encode_entry(entry))
    assert (doc["tool"], doc["toolset"], doc["arguments"]) == (
        "mail.send_email", "team-a/mailer", {"to": "a@b.c", "n": [1, 2]})
    assert "channel" not in doc and "payload" not in doc
    assert decode_entry(encode_entry(entry)) == entry


def test_entries_written_before_the_typed_codec_still_decode():
    legacy = json.dumps({"channel": "hooks", "payload": 1, "idempotency_key": "\u202e",
                         "transaction_id": "tx", "seq": 2, "attempts": 4,
                         "next_attempt_at": 9.5, "claimed_by": None, "claim_until": 0.0,
                         "last_error": None, "created_at": 3.0}, sort_keys=True).encode()
    entry = decode_entry(legacy)
    assert entry == OutboxEntry(kind="effect", idempotency_key="\u202e", transaction_id="tx",
                                seq=2, created_at=3.0, owner="", channel="hooks", payload=1,
                                attempts=4, next_attempt_at=9.5)


@pytest.mark.parametrize(("raw", "message"), [
    (b"not json", "outbox entry is not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"channel": "hooks"}', "field `idempotency_key` is not a string"),
    (b'{"idempotency_key": "k"}', "names no channel"),
    (b'{"kind": "deferred", "idempotency_key": "k"}', "names no tool"),
    (b'{"kind": "sms", "channel": "x", "idempotency_key": "k"}', "kind 'sms' is not one of"),
    (b'{"channel": "x", "idempotency_key": "k", "attempts": "3"}', "`attempts` is not a number"),
    (b'{"channel": "x", "idempotency_key": "k", "claimed_by": 7}', "`claimed_by` is not a string"),
])
def test_what_the_codec_did_not_write_is_refused_with_the_reason(raw, message):
    with pytest.raises(ValueError, match=message):
        decode_entry(raw)


def test_a_dead_letter_is_the_entry_plus_when_it_died():
    entry = effect_entry("hooks", [1], "k-9", "tx-9", 1, now=10.0, owner="bob")
    failed = entry.failed("http://r answered HTTP 400 Bad Request", 12.0)
    letter = DeadLetter(failed, 12.5)
    raw = encode_dead_letter(letter)
    assert json.loads(raw)["dead_at"] == 12.5
    assert decode_dead_letter(raw) == letter
    assert decode_entry(raw) == failed  # the letter's bytes are an entry, plus dead_at


# ---- the entry's bookkeeping ---------------------------------------------------------------

def test_due_means_backoff_over_and_no_live_claim():
    entry = effect_entry("hooks", 1, "k", "tx", 1, now=100.0)
    assert entry.is_due(100.0)
    waiting = entry.failed("boom", 110.0)
    assert not waiting.is_due(105.0) and waiting.is_due(110.0)
    claimed = entry.claimed("replica-a", 130.0)
    assert not claimed.is_due(129.9) and claimed.is_due(130.0)


def test_a_failed_attempt_is_counted_unclaimed_and_its_error_kept_short():
    entry = effect_entry("hooks", 1, "k", "tx", 1, now=1.0, claimed_by="r", claim_s=30)
    once = entry.failed("x" * (MAX_ERROR_CHARS + 50), 5.0)
    assert (once.attempts, once.claimed_by, once.claim_until, once.next_attempt_at) == (
        1, "", 0.0, 5.0)
    assert once.last_error == "x" * MAX_ERROR_CHARS
    assert once.failed("again", 6.0).attempts == 2


def test_reservation_values_name_the_transaction_and_why():
    assert json.loads(reservation_value("tx-1", 0, "dead")) == {
        "tx": "tx-1", "step": 0, "state": "dead"}


# ---- idempotency keys --------------------------------------------------------------------

@pytest.mark.parametrize("key", ["a", "order-42", "!~", "k" * 200,
                                 "".join(chr(c) for c in range(0x21, 0x7F))])
def test_printable_ascii_keys_up_to_200_characters_are_accepted(key):
    assert idempotency_key_problem(key) is None


@pytest.mark.parametrize(("key", "problem"), [
    ("", "invalid length 0, expected 1 to 200 printable ASCII characters (`!` to `~`)"),
    ("k" * 201, "invalid length 201, expected 1 to 200 printable ASCII characters"),
    (" ", 'invalid value: string " ", expected 1 to 200'),
    ("a b", 'invalid value: string "a b", expected'),
    ("\u202e", 'invalid value: string "\\u202e", expected'),
    ("caf\u00e9", 'invalid value: string "caf\\u00e9", expected'),
    ("line\nbreak", 'invalid value: string "line\\nbreak", expected'),
    ("tab\t", 'invalid value: string "tab\\t", expected'),
    ("\x7f", 'invalid value: string "\\u007f", expected'),
])
def test_other_keys_are_refused_serde_style_and_shown_ascii_escaped(key, problem):
    found = idempotency_key_problem(key)
    assert found is not None and found.startswith(problem)
    assert found.isascii()


# ---- permanent or transient --------------------------------------------------------------

@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 451, 499])
def test_http_4xx_refusals_are_permanent(status):
    assert http_status_is_permanent(status)


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504, 599, 100, 301, 302, 304])
def test_http_408_425_429_5xx_and_the_rest_are_transient(status):
    assert not http_status_is_permanent(status)


def test_the_transient_4xx_are_exactly_408_425_429():
    assert frozenset({408, 425, 429}) == TRANSIENT_HTTP_4XX


@pytest.mark.parametrize(("code", "permanent"), [
    (550, True), (551, True), (552, True), (553, True), (554, True), (535, True),
    (421, False), (450, False), (451, False), (452, False), (454, False)])
def test_smtp_5xx_is_permanent_and_4xx_transient(code, permanent):
    assert smtp_code_is_permanent(code) is permanent


def test_a_delivery_error_is_transient_unless_it_says_otherwise():
    assert DeliveryError("timed out").permanent is False
    assert DeliveryError("answered HTTP 400", permanent=True).permanent is True
