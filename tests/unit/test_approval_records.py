"""Approvals, the pure parts (docs/approvals.md): the policy record and how its layers
combine, what is gated, the digest, who may decide, the pending record, the header's
codec. No etcd here; the service is exercised in tests/integration/test_approvals.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from agenttx.config import Settings
from agenttx.contracts.layout import Keys
from agenttx.contracts.outbox import DEFERRED_CHANNEL
from agenttx.contracts.policy import (
    APPROVAL_TIMEOUT_DEFAULT_S,
    ApprovalSettings,
    PublishedPolicy,
    Requirement,
    approval_from_spec,
    approval_to_spec,
    parse_published_policy,
    policy_to_json,
    resolve_approval,
)
from agenttx.engine.approvals import (
    ApprovalRecord,
    Gated,
    approval_digest,
    decode_record,
    encode_record,
    gated_steps,
    in_scope,
    notify_event,
    write_set,
)
from agenttx.engine.model import Caller
from agenttx.engine.policy import RollbackSettings, resolve_policy
from agenttx.engine.state import (
    Buffered,
    GatedCall,
    PendingApproval,
    StagedEffect,
    Touched,
    TxHeader,
    TxPolicy,
    WriteState,
    decode_gated,
    decode_header,
    encode_gated,
    encode_header,
)
from agenttx.engine.steps import _gated

PAYMENTS = ApprovalSettings((Requirement("channel", "payments"), Requirement("tool", "tickets.*")),
                            (), 86400, "")


# ---- the policy record -------------------------------------------------------------------

def test_the_default_policy_json_of_the_docs_parses_to_its_settings(monkeypatch):
    monkeypatch.setenv("AGENTTX_DEFAULT_POLICY__APPROVAL", json.dumps(
        {"required": [{"channel": "payments"}, {"tool": "tickets.*"}], "approvers": [],
         "timeoutSeconds": 86400, "notifyChannel": ""}))
    assert Settings().default_policy.approval_settings() == PAYMENTS


def test_without_the_setting_nothing_is_required():
    default = Settings().default_policy.approval_settings()
    assert default == ApprovalSettings((), (), APPROVAL_TIMEOUT_DEFAULT_S, "")
    assert resolve_approval([default]) is None


@pytest.mark.parametrize(("doc", "message"), [
    ({"required": [{"tool": "a", "channel": "b"}]},
     "approval.required[0]: must have exactly one of `tool` or `channel`"),
    ({"required": [{"chanel": "payments"}]},
     "approval.required[0]: must have exactly one of `tool` or `channel`"),
    ({"required": [{"tool": ""}]}, "approval.required[0].tool: must be a non-empty string"),
    ({"required": {"tool": "x"}}, "approval.required: must be a list"),
    ({"timeoutSeconds": 4}, "approval.timeoutSeconds: must be an integer between 5 and 2592000"),
    ({"timeoutSeconds": 2592001}, "approval.timeoutSeconds: must be an integer between 5"),
    ({"timeoutSeconds": True}, "approval.timeoutSeconds: must be an integer"),
    ({"approvers": "alice"}, "approval.approvers: must be a list of principals"),
    ({"approvers": [""]}, "approval.approvers: must be a list of principals"),
    ({"notifyChannel": 7}, "approval.notifyChannel: must be a channel name"),
    ({"required": [{"tool": "x"}] * 65}, "approval.required: at most 64 entries"),
    ({"approver": ["alice"]}, "approval.approver: unknown field"),
    ([], "approval: must be an object"),
])
def test_a_bad_approval_names_its_field(doc, message):
    with pytest.raises(ValueError) as exc:
        approval_from_spec(doc)
    assert str(exc.value).startswith(message), str(exc.value)


def test_the_default_policy_refuses_a_bad_approval_naming_the_field(monkeypatch):
    monkeypatch.setenv("AGENTTX_DEFAULT_POLICY__APPROVAL", '{"required": [{"tol": "x"}]}')
    with pytest.raises(ValueError, match=r"approval\.required\[0\]: must have exactly one"):
        Settings()


def test_a_published_policy_carries_its_approval_and_others_keep_their_bytes():
    approval = approval_from_spec({"required": [{"tool": "mail.*"}], "notifyChannel": "ops"})
    plain = PublishedPolicy("team-a", "p", 1, 0)
    with_approval = PublishedPolicy("team-a", "p", 1, 0, approval=approval)
    assert b"approval" not in policy_to_json(plain)
    raw = policy_to_json(with_approval)
    assert json.loads(raw)["approval"] == {"required": [{"tool": "mail.*"}],
                                           "notifyChannel": "ops"}
    assert parse_published_policy(raw) == with_approval
    assert approval_to_spec(approval_from_spec(approval_to_spec(approval))) == \
        approval_to_spec(approval)


def test_requirements_add_up_and_the_most_specific_layer_sets_the_rest():
    default = approval_from_spec({"required": [{"channel": "payments"}], "approvers": ["ops"],
                                  "timeoutSeconds": 600, "notifyChannel": "pager"})
    team = approval_from_spec({"required": [{"tool": "tickets.*"}, {"channel": "payments"}],
                               "timeoutSeconds": 3600})
    got = resolve_approval([default, team])
    assert got == ApprovalSettings(
        (Requirement("channel", "payments"), Requirement("tool", "tickets.*")),
        ("ops",), 3600, "pager")
    # a team policy that says nothing about approvals changes nothing
    assert resolve_approval([default, None]) == ApprovalSettings(
        (Requirement("channel", "payments"),), ("ops",), 600, "pager")
    # an empty list of approvers set by the team widens to every approver in scope
    assert resolve_approval([default, approval_from_spec({"approvers": []})]).approvers == ()


def test_a_request_policy_cannot_remove_an_approval_requirement():
    published = PublishedPolicy("team-a", "p", 1, 0,
                                approval=approval_from_spec({"required": [{"tool": "x.*"}]}))
    resolved = resolve_policy(defaults=RollbackSettings(), default_idle_timeout_s=900,
                              published=published, request_max_local_depth=0,
                              request_max_global_resets=0, request_replay_budget_factor=1.0,
                              default_approval=PAYMENTS)
    assert resolved.rollback == RollbackSettings(0, 0, 1.0)
    assert resolved.approval is not None
    assert [r.doc() for r in resolved.approval.required] == [
        {"channel": "payments"}, {"tool": "tickets.*"}, {"tool": "x.*"}]


def test_tool_globs_and_channels_match_as_documented():
    a = approval_from_spec({"required": [{"tool": "tickets.*"}, {"tool": "mail.send_?mail"},
                                         {"channel": "payments"}]})
    assert a.gates_tool("tickets.close_ticket") and a.gates_tool("mail.send_email")
    assert not a.gates_tool("ticketsX") and not a.gates_tool("Tickets.close")
    assert a.gates_channel("payments") and not a.gates_channel("payments2")
    assert not a.gates_tool("payments")


# ---- what is gated, and the digest --------------------------------------------------------

def _step_gates(approval, tool, arguments, effects):
    header = TxHeader(id="t", principal="p", agent_id="a", status="ACTIVE",
                      policy=TxPolicy(3, 1, 2.0, 900, "/fs", "server-default"),
                      created_at=1.0, updated_at=1.0, approval=approval)
    return _gated(header, 4, tool, arguments, effects)


def test_a_step_records_its_effects_on_listed_channels_with_their_payloads():
    effects = [StagedEffect("payments", {"amount": 10}, "k1"), StagedEffect("audit", 1, "k2")]
    assert _step_gates(PAYMENTS, "effect.stage", {"channel": "payments"}, effects) == (
        GatedCall(4, "effect.stage", "payments", {"amount": 10}),)
    # a plug-in effect tool is shown under its own name
    assert _step_gates(PAYMENTS, "notify.team", {"text": "x"}, effects[:1]) == (
        GatedCall(4, "notify.team", "payments", {"amount": 10}),)
    assert _step_gates(PAYMENTS, "effect.stage", {}, effects[1:]) == ()


def test_a_step_whose_tool_matches_a_glob_records_its_resolved_call_or_every_effect():
    assert _step_gates(PAYMENTS, "tickets.close", {"id": 7}, []) == (
        GatedCall(4, "tickets.close", "", {"id": 7}),)
    every = approval_from_spec({"required": [{"tool": "effect.*"}]})
    assert _step_gates(every, "effect.stage", {"channel": "audit"},
                       [StagedEffect("audit", 1, "k")]) == (
        GatedCall(4, "effect.stage", "audit", 1),)
    assert _step_gates(PAYMENTS, "kv.put", {"key": "a"}, []) == ()
    assert _step_gates(None, "tickets.close", {"id": 7}, []) == ()


def test_a_gated_deferred_toolset_call_is_recorded_once_as_its_call():
    mail = approval_from_spec({"required": [{"tool": "mail.*"}]})
    deferred = [StagedEffect(f"{DEFERRED_CHANNEL}team-a/mail",
                             {"name": "mail.send_email", "arguments": {"to": "a@b"}}, "k")]
    assert _step_gates(mail, "mail.send_email", {"to": "a@b"}, deferred) == (
        GatedCall(4, "mail.send_email", "", {"to": "a@b"}),)
    assert _step_gates(PAYMENTS, "mail.send_email", {"to": "a@b"}, deferred) == ()


def test_gated_steps_are_what_the_live_steps_recorded_in_order():
    calls = [GatedCall(2, "effect.stage", "payments", {"amount": 10}),
             GatedCall(3, "tickets.close", "", {"id": 7})]
    assert gated_steps(calls) == [Gated(2, "effect.stage", "payments", {"amount": 10}),
                                  Gated(3, "tickets.close", "", {"id": 7})]


def test_the_write_set_is_in_key_order_with_deletes_as_null():
    keys = Keys("/p")
    entries = {
        keys.kv("b"): Touched(0, WriteState(Buffered(False, {"value": 2}))),
        keys.record("orders", 7): Touched(3, WriteState(Buffered(False, {"fields": {"a": 1}}))),
        keys.kv("a"): Touched(5, WriteState(Buffered(True))),
        keys.kv("read-only"): Touched(9),
        b"fs:notes.txt": Touched(None, WriteState(None, 1, "put", b"/p/locks/fs/x")),
    }
    assert write_set(keys, entries) == [("kv:a", None), ("kv:b", {"value": 2}),
                                        ("rec:orders:7", {"fields": {"a": 1}})]


def test_the_digest_is_the_sha256_of_the_documented_canonical_json():
    gated = [Gated(2, "effect.stage", "payments", {"to": "Zoë", "amount": 10})]
    writes = [("kv:a", None), ("kv:b", {"value": 2})]
    canonical = ('{"gated":[{"arguments":{"amount":10,"to":"Zoë"},"channel":"payments",'
                 '"step_id":2,"tool":"effect.stage"}],"writes":[{"key":"kv:a","write":null},'
                 '{"key":"kv:b","write":{"value":2}}]}')
    assert approval_digest(gated, writes) == hashlib.sha256(canonical.encode()).hexdigest()


def test_the_digest_changes_with_any_argument_payload_or_write():
    gated = [Gated(2, "effect.stage", "payments", {"amount": 10})]
    writes = [("kv:a", {"value": 1})]
    base = approval_digest(gated, writes)
    assert approval_digest([Gated(2, "effect.stage", "payments", {"amount": 11})],
                           writes) != base
    assert approval_digest([Gated(2, "effect.stage", "refunds", {"amount": 10})],
                           writes) != base
    assert approval_digest(gated, [("kv:a", {"value": 2})]) != base
    assert approval_digest(gated, [("kv:a", None)]) != base
    assert approval_digest(gated, writes) == base


# ---- who may decide ------------------------------------------------------------------------

def approver(name: str, ns: str | None, **kw: bool) -> Caller:
    return Caller(name, ns, authenticated=True, approver=kw.get("approver", True),
                  admin=kw.get("admin", False))


@pytest.mark.parametrize(("caller", "approvers", "allowed"), [
    (Caller(), (), True),                                        # no authentication
    (approver("root", "elsewhere", approver=False, admin=True), ("x",), True),
    (approver("lead", "team-a"), (), True),                      # same namespace
    (approver("platform", "agenttx"), (), True),                 # the service namespace
    (approver("lead-b", "team-b"), (), False),                   # another namespace
    (approver("no-ns", None), (), False),
    (approver("agent", "team-a", approver=False), (), False),    # no approver role
    (approver("lead", "team-a"), ("oncall",), False),            # narrowed to others
    (approver("oncall", "team-a"), ("oncall",), True),
    (approver("oncall", "team-b"), ("oncall",), False),          # named, but out of scope
])
def test_who_may_decide(caller, approvers, allowed):
    assert in_scope(caller, "team-a", approvers, "agenttx") is allowed


# ---- records ---------------------------------------------------------------------------------

def test_the_pending_record_round_trips_and_the_notify_event_has_the_documented_fields():
    record = ApprovalRecord("tx-1", "billing-agent", "team-a", "refund-bot", "ab" * 32,
                            (Gated(2, "effect.stage", "payments", {"amount": 10}),
                             Gated(3, "tickets.close", "", {"id": 7})),
                            ("kv:a",), 100.0, 200.0, ("lead",))
    assert decode_record(encode_record(record)) == record
    assert notify_event(record) == {
        "event": "approval.requested", "transaction_id": "tx-1",
        "principal": "billing-agent", "agent_id": "refund-bot", "digest": "ab" * 32,
        "gated": [{"step_id": 2, "tool": "effect.stage", "channel": "payments"},
                  {"step_id": 3, "tool": "tickets.close", "channel": ""}],
        "expires_at": 200.0}


def test_the_header_keeps_the_approval_namespace_and_pending_digest():
    h = TxHeader(id="t", principal="p", agent_id="a", status="AWAITING_APPROVAL",
                 policy=TxPolicy(3, 1, 2.0, 900, "/fs", "server-default"), created_at=1.0,
                 updated_at=2.0, approval=PAYMENTS, namespace="team-a",
                 pending=PendingApproval("cd" * 32, 3.0, 4.0))
    assert decode_header(encode_header(h)) == h
    plain = TxHeader(id="t", principal="p", agent_id="a", status="ACTIVE",
                     policy=TxPolicy(3, 1, 2.0, 900, "/fs", "server-default"),
                     created_at=1.0, updated_at=2.0)
    raw = encode_header(plain)
    assert b'"ap"' not in raw and b'"pa"' not in raw and b'"ns"' not in raw
    assert decode_header(raw) == plain


def test_a_gated_call_round_trips():
    g = GatedCall(4, "mail.send_email", "", {"to": "a@b", "n": [1, 2.5, None]})
    assert decode_gated(encode_gated(g)) == g
