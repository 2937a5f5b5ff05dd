"""The toolset registry and its parts, without I/O: scope by namespace, which of two
declarations wins, what ListTools adds to a description, how a compensation is built,
the saga intent's record and CAS, and the toolsets file's parser."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from agenttx.contracts.layout import Keys
from agenttx.contracts.toolsets import ToolsetError, from_spec
from agenttx.engine.ops import intent_plan
from agenttx.engine.state import (
    ACTIVE,
    SagaPending,
    TxHeader,
    TxPolicy,
    decode_header,
    encode_header,
)
from agenttx.tools.base import RollbackKind
from agenttx.tools.registry import EVERYONE, Scope, ToolRegistry
from agenttx.tools.toolsets import Toolsets
from agenttx.tools.toolsets.tool import undo_sentence
from agenttx.workers.toolsets import parse_toolsets_file

URL = "http://127.0.0.1:9/mcp"


def toolset(ns: str, name: str, prefix: str, tools: list[dict] | None = None, url: str = URL):
    return from_spec(ns, name, 0, {"upstream": {"url": url}, "prefix": prefix,
                                   "tools": tools or [{"name": "search", "kind": "read"}]})


def registry(*toolsets, service_namespace: str = "") -> Toolsets:
    reg = Toolsets(service_namespace=service_namespace)
    reg.set_file(toolsets)
    return reg


A, B = Scope(True, "team-a"), Scope(True, "team-b")


def test_without_authentication_every_toolset_is_visible() -> None:
    reg = registry(toolset("team-a", "t", "tickets"), toolset("team-b", "m", "mail"),
                   service_namespace="platform")
    assert reg.names(EVERYONE) == ["mail.search", "tickets.search"]


def test_a_caller_sees_its_namespace_and_the_service_namespace() -> None:
    reg = registry(toolset("team-a", "t", "tickets"), toolset("team-b", "m", "mail"),
                   toolset("platform", "l", "lookup"), service_namespace="platform")
    assert reg.names(A) == ["lookup.search", "tickets.search"]
    assert reg.names(B) == ["lookup.search", "mail.search"]
    assert reg.tool("mail.search", A) is None
    assert reg.tool("mail.search", B).toolset_key == "team-b/m"
    # a principal without a namespace (mTLS without a SPIFFE id) gets the service's only
    assert reg.names(Scope(True, None)) == ["lookup.search"]


def test_without_a_service_namespace_a_caller_sees_its_own_only() -> None:
    reg = registry(toolset("team-a", "t", "tickets"), toolset("platform", "l", "lookup"))
    assert reg.names(A) == ["tickets.search"]
    assert reg.names(Scope(True, None)) == []


def test_two_visible_toolsets_with_one_name_resolve_to_the_callers_own_namespace() -> None:
    reg = registry(toolset("team-a", "t", "tickets"), toolset("platform", "t2", "tickets"),
                   service_namespace="platform")
    assert reg.tool("tickets.search", A).toolset_key == "team-a/t"
    assert reg.tool("tickets.search", B).toolset_key == "platform/t2"
    assert reg.tool("tickets.search", EVERYONE).toolset_key == "platform/t2"  # lower key
    # undo finds a step's tool whatever the scope; its compensation names its toolset
    assert reg.any_tool("tickets.search") is not None


def test_a_file_toolset_overrides_the_published_one_of_the_same_name() -> None:
    reg = Toolsets()
    reg.replace_published({"team-a/t": toolset("team-a", "t", "published")})
    assert reg.names(EVERYONE) == ["published.search"]
    reg.set_file([toolset("team-a", "t", "fromfile")])
    assert reg.names(EVERYONE) == ["fromfile.search"]
    assert reg.current("team-a/t").source == "file"
    reg.set_file([])
    assert reg.names(EVERYONE) == ["published.search"]
    reg.set_published("team-a/t", None)
    assert reg.names(EVERYONE) == [] and reg.current("team-a/t") is None


def test_a_changed_toolset_keeps_its_upstream_client_unless_the_upstream_changed() -> None:
    reg = registry(toolset("ns", "t", "tickets"))
    first = reg.current("ns/t").upstream
    reg.set_file([toolset("ns", "t", "tickets", [{"name": "other", "kind": "read"}])])
    assert reg.current("ns/t").upstream is first
    assert reg.names(EVERYONE) == ["tickets.other"]
    reg.set_file([toolset("ns", "t", "tickets", url="http://127.0.0.1:10/mcp")])
    assert reg.current("ns/t").upstream is not first


def test_tools_get_the_rollback_kind_of_their_declared_kind() -> None:
    reg = registry(toolset("ns", "t", "x", [
        {"name": "r", "kind": "read"}, {"name": "d", "kind": "deferred"},
        {"name": "s", "kind": "saga", "compensate": {"tool": "undo_s"}}]))
    kinds = {n: reg.tool(n, EVERYONE) for n in reg.names(EVERYONE)}
    assert {n: (t.rollback, t.durable_intent) for n, t in kinds.items()} == {
        "x.r": (RollbackKind.READ_ONLY, False), "x.d": (RollbackKind.EFFECT, False),
        "x.s": (RollbackKind.SAGA, True)}


def test_builtins_are_found_before_any_toolset_and_names_are_scoped() -> None:
    tools = ToolRegistry.load(plugins=False)
    tools.attach(registry(toolset("team-a", "t", "tickets"), service_namespace="p"))
    assert tools.lookup("kv.put", B).name == "kv.put"
    assert tools.lookup("tickets.search", A) is not None
    assert tools.lookup("tickets.search", B) is None
    assert "tickets.search" in tools.names_in(A) and "tickets.search" not in tools.names_in(B)
    assert "tickets.search" not in tools.names()     # the built-ins and plug-ins


def test_list_tools_says_how_each_kind_is_undone() -> None:
    t = toolset("ns", "t", "x", [
        {"name": "r", "kind": "read"}, {"name": "d", "kind": "deferred"},
        {"name": "s", "kind": "saga", "compensate": {"tool": "cancel_order"}}])
    sentences = {s.name: undo_sentence(s) for s in t.tools}
    assert sentences == {
        "r": "A read: it runs at once and changes nothing, so a rollback has nothing to undo.",
        "d": "Runs only when the transaction commits (staged until then); a rollback "
             "discards it.",
        "s": "Acts at once; if the transaction rolls back, AgentTx undoes it by calling "
             "cancel_order."}


def test_a_compensation_is_resolved_from_the_arguments_and_output_or_marked_unresolved() -> None:
    reg = registry(toolset("ns", "t", "tickets", [
        {"name": "create", "kind": "saga",
         "compensate": {"tool": "close", "arguments": {"id": "${output.id}",
                                                       "why": "undo ${arguments.title}"}}}]))
    tool = reg.tool("tickets.create", EVERYONE)
    spec = tool.spec.compensate
    doc = tool._compensation(spec.arguments, {"title": "x"}, {"id": 7}, "tx/1/a")
    assert doc == {"toolset": "ns/t", "tool": "close", "name": "tickets.close",
                   "key": "tx/1/a", "arguments": {"id": 7, "why": "undo x"}}
    missing = tool._compensation(spec.arguments, {"title": "x"}, {"other": 1}, "tx/1/a")
    assert missing["unresolved"] == "${output.id} is not in the step's arguments or output"


def test_a_saga_marker_survives_the_header_codec_and_its_cas_writes_the_intent() -> None:
    keys = Keys("/p")
    header = TxHeader(id="tx", principal="", agent_id="a", status=ACTIVE,
                      policy=TxPolicy(3, 1, 2.0, 900, "/sb", "default"), created_at=1.0,
                      updated_at=1.0, next_step_id=3)
    marked = replace(header, saga_pending=SagaPending(3, "att", "replica-a", 10.0, 50.0, True))
    assert decode_header(encode_header(marked)) == marked
    assert decode_header(encode_header(header)).saga_pending is None
    plan = intent_plan(keys, header, 41, marked, b'{"step":3}')
    assert [(c.key, c.operand) for c in plan.compares] == [(keys.tx_header("tx"), 41)]
    assert [(op.key, op.value) for op in plan.success] == [
        (keys.tx_header("tx"), encode_header(marked)), (keys.saga_intent("tx"), b'{"step":3}')]
    assert keys.saga_intent("tx").startswith(keys.tx_prefix("tx"))  # ends with the tx


def test_a_toolsets_file_is_yaml_or_json_and_a_broken_one_says_where() -> None:
    doc = {"toolsets": [{"namespace": "default", "name": "t", "spec": {
        "upstream": {"url": URL, "headers": [{"name": "X-Key", "value": "v"}]},
        "prefix": "tickets", "tools": [{"name": "search", "kind": "read"}]}}]}
    as_yaml = ("toolsets:\n  - name: t\n    spec:\n      upstream: {url: "
               f"'{URL}'}}\n      prefix: tickets\n      tools:\n"
               "        - {name: search, kind: read}\n")
    good, skipped = parse_toolsets_file(json.dumps(doc).encode(), "t.json")
    assert ([t.key for t in good], skipped) == (["default/t"], [])
    assert [t.key for t in parse_toolsets_file(as_yaml.encode(), "t.yaml")[0]] == ["default/t"]
    assert parse_toolsets_file(b"", "empty.yaml") == ([], [])
    with pytest.raises(ToolsetError, match=r"b.yaml: not valid YAML or JSON at line 3 column 1"):
        parse_toolsets_file(b"toolsets:\n  - {name: t\n", "b.yaml")
    with pytest.raises(ToolsetError, match=r"toolsets must be a list"):
        parse_toolsets_file(b"toolsets: 3\n", "s.yaml")
    # a broken toolset is skipped, saying why; the others load
    mixed = {"toolsets": [{"name": "bad", "spec": {"prefix": "kv"}}, doc["toolsets"][0],
                          doc["toolsets"][0]]}
    good, skipped = parse_toolsets_file(json.dumps(mixed).encode(), "m.json")
    assert [t.key for t in good] == ["default/t"]
    assert skipped[0].startswith("toolsets[0] ('bad'): spec.upstream")
    assert skipped[1] == "toolsets[2]: default/t is declared more than once"


def test_the_toolsets_files_the_docs_show_are_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    doc = (root / "docs" / "toolsets.md").read_text()
    block = re.search(r"```yaml\n# toolsets.yaml[^\n]*\n(.*?)```", readme, re.S)
    assert block is not None
    assert [t.key for t in parse_toolsets_file(block.group(1).encode(), "README.md")[0]] == \
        ["default/tickets"]
    block = re.search(r"```yaml\n(toolsets:.*?)```", doc, re.S)
    assert block is not None
    parsed, skipped = parse_toolsets_file(block.group(1).encode(), "docs/toolsets.md")
    assert skipped == []
    assert {t.key: [s.kind for s in t.tools] for t in parsed} == {
        "default/tickets": ["saga", "saga", "read"], "default/mail": ["deferred"]}


def test_a_staged_deferred_call_becomes_a_deferred_outbox_entry_at_commit() -> None:
    from agenttx.contracts.outbox import DEFERRED_CHANNEL, decode_entry, encode_entry
    from agenttx.engine.commit import outbox_entries
    from agenttx.engine.state import StagedEffect

    keys = Keys("/p")
    header = TxHeader(id="tx", principal="agent-a", agent_id="a", status=ACTIVE,
                      policy=TxPolicy(3, 1, 2.0, 900, "/sb", "default"), created_at=1.0,
                      updated_at=1.0, next_step_id=3)
    staged = [StagedEffect("log", {"n": 1}, "k1"),
              StagedEffect(DEFERRED_CHANNEL + "team-a/mail",
                           {"name": "mail.send_email", "tool": "send_email",
                            "arguments": {"to": "x@example.com"}}, "k2")]
    (k1, effect), (k2, deferred) = outbox_entries(keys, header, staged, now=5.0,
                                                  claimed_by="r1", claim_s=30)
    assert (k1, k2) == (keys.outbox("tx", 1), keys.outbox("tx", 2))
    assert (effect.kind, effect.channel, effect.payload) == ("effect", "log", {"n": 1})
    assert (deferred.kind, deferred.tool, deferred.toolset, deferred.arguments,
            deferred.idempotency_key, deferred.owner, deferred.claimed_by,
            deferred.claim_until) == ("deferred", "mail.send_email", "team-a/mail",
                                      {"to": "x@example.com"}, "k2", "agent-a", "r1", 35.0)
    assert decode_entry(encode_entry(deferred)) == deferred
