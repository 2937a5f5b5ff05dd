"""Toolsets by namespace (docs/toolsets.md, docs/security.md) and where toolsets come
from: a replica with token authentication (two namespaces plus the service namespace),
a YAML `--toolsets-file` re-read when it changes, and toolsets published in etcd the way
the operator publishes them.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from agenttx.client import Client
from agenttx.contracts.layout import Keys
from agenttx.contracts.toolsets import from_spec, to_json
from support.mcp_upstreams import Upstreams, mailer, tracker
from support.service import ServiceProcess
from support.waiting import eventually, slack

FILE_POLL_S = 2.0      # workers/toolsets.py FILE_POLL_S
TOKEN_A, TOKEN_B = f"token-a-{uuid.uuid4().hex}", f"token-b-{uuid.uuid4().hex}"


@dataclass
class Svc:
    proc: ServiceProcess
    file: Path
    doc: dict
    keys: Keys

    def client(self, token: str) -> Client:
        return Client(self.proc.target, token=token)

    def tools(self, token: str) -> dict:
        with self.client(token) as c:
            return {t.name: t for t in c.tools()}


@pytest.fixture(scope="module")
def ups() -> Iterator[Upstreams]:
    with tracker() as t, mailer() as m:
        yield Upstreams(t, m)


def _toolset(ns: str, name: str, url: str, prefix: str, tools: list[dict]) -> dict:
    return {"namespace": ns, "name": name,
            "spec": {"upstream": {"url": url}, "prefix": prefix, "tools": tools}}


@pytest.fixture(scope="module")
def svc(etcd, scratch, sandbox, ups) -> Iterator[Svc]:
    folder = scratch / f"toolsets-scope-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    tokens = folder / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"sha256": hashlib.sha256(TOKEN_A.encode()).hexdigest(), "principal": "agent-a",
         "namespace": "team-a"},
        {"sha256": hashlib.sha256(TOKEN_B.encode()).hexdigest(), "principal": "agent-b",
         "namespace": "team-b"}]}))
    doc = {"toolsets": [
        _toolset("team-a", "tickets", ups.tracker.url, "tickets",
                 [{"name": "search_tickets", "kind": "read"},
                  {"name": "create_ticket", "kind": "saga",
                   "compensate": {"tool": "close_ticket", "arguments": {"id": "${output.id}"}}}]),
        _toolset("team-b", "mail", ups.mailer.url, "mail",
                 [{"name": "send_email", "kind": "deferred"}]),
        _toolset("platform", "lookup", ups.tracker.url, "lookup",
                 [{"name": "search_tickets", "kind": "read"}]),
    ]}
    path = folder / "toolsets.yaml"
    path.write_text(yaml.safe_dump(doc))
    prefix = f"/agenttx-tsscope-{uuid.uuid4().hex[:8]}"
    proc = ServiceProcess("toolsets-scope", etcd_endpoints=etcd.endpoints, prefix=prefix,
                          fs_root=str(sandbox), workdir=folder,
                          extra_args=["--auth", "token", "--auth-tokens-file", str(tokens),
                                      "--service-namespace", "platform",
                                      "--toolsets-file", str(path)]).start()
    yield Svc(proc, path, doc, Keys(prefix))
    proc.stop()


def test_a_caller_sees_its_own_namespaces_toolsets_and_the_service_namespaces(svc):
    a, b = svc.tools(TOKEN_A), svc.tools(TOKEN_B)
    assert {n for n in a if "." in n and n.split(".")[0] in ("tickets", "mail", "lookup")} \
        == {"tickets.search_tickets", "tickets.create_ticket", "lookup.search_tickets"}
    assert {n for n in b if n.split(".")[0] in ("tickets", "mail", "lookup")} == \
        {"mail.send_email", "lookup.search_tickets"}
    assert (a["tickets.create_ticket"].toolset, b["mail.send_email"].toolset,
            a["lookup.search_tickets"].toolset) == ("team-a/tickets", "team-b/mail",
                                                    "platform/lookup")
    assert "kv.put" in a and "kv.put" in b


def test_a_toolset_outside_the_callers_scope_is_an_unknown_tool(svc, ups):
    title = f"not yours {uuid.uuid4().hex[:8]}"
    with svc.client(TOKEN_B) as client, client.transaction(agent_id="b") as tx:
        theirs = tx.step("tickets.create_ticket", {"title": title})
        typo = tx.step("mail.send_emial", {"to": "x@example.com", "subject": "s"})
        tx.rollback()
    assert (theirs.ok, theirs.category) == (False, "undefined_function")
    assert "tickets.create_ticket" in theirs.hint and "tickets." not in \
        theirs.hint.split(";", 1)[1]           # never suggests another namespace's tool
    assert typo.category == "undefined_function" and "mail.send_email" in typo.hint
    assert ups.tracker.calls_to("create_ticket", title=title) == []
    with svc.client(TOKEN_A) as client, client.transaction(agent_id="a") as tx:
        mine = tx.step("tickets.create_ticket", {"title": title})
        tx.rollback()
    assert mine.ok and ups.tracker.calls_to("close_ticket", id=mine.output["id"])


def test_the_toolsets_file_is_read_again_when_it_changes(svc):
    changed = json.loads(json.dumps(svc.doc))
    undo = {"tool": "delete_comment",
            "arguments": {"id": "${arguments.id}", "text": "${arguments.text}"}}
    changed["toolsets"][0]["spec"]["tools"].append(
        {"name": "add_comment", "kind": "saga", "compensate": undo})
    # one broken toolset beside it is skipped (logged); it costs the others nothing
    changed["toolsets"].append({"namespace": "team-a", "name": "broken",
                                "spec": {"upstream": {"url": "ftp://nowhere"}}})
    svc.file.write_text(yaml.safe_dump(changed))
    try:
        eventually(lambda: "tickets.add_comment" in svc.tools(TOKEN_A), slack(FILE_POLL_S),
                   "the new tool served")
        assert any(r.get("msg") == "skipping an invalid toolset"
                   and "toolsets[3] ('broken')" in r.get("error", "")
                   for r in svc.proc.logs())
        svc.file.write_text("toolsets: [ {namespace: team-a")    # broken: ignored, logged
        eventually(lambda: any(r.get("msg") == "ignoring an invalid --toolsets-file"
                               for r in svc.proc.logs()), slack(FILE_POLL_S), "logged")
        assert "tickets.add_comment" in svc.tools(TOKEN_A)      # the last good file stays
    finally:
        svc.file.write_text(yaml.safe_dump(svc.doc))
    eventually(lambda: "tickets.add_comment" not in svc.tools(TOKEN_A), slack(FILE_POLL_S),
               "the file restored")


async def test_published_toolsets_are_served_and_a_file_toolset_of_the_same_name_wins(
        svc, ups, store):
    published = from_spec("team-a", "published", 1, {
        "upstream": {"url": ups.tracker.url}, "prefix": "pub",
        "tools": [{"name": "search_tickets", "kind": "read"}]})
    key = svc.keys.toolset("team-a", "published")
    await store.put(key, to_json(published))
    eventually(lambda: "pub.search_tickets" in svc.tools(TOKEN_A), slack(5), "published")
    assert svc.tools(TOKEN_A)["pub.search_tickets"].toolset == "team-a/published"
    assert "pub.search_tickets" not in svc.tools(TOKEN_B)
    # the same <ns>/<name> as a file toolset: the file's wins, and the override is logged
    shadow = from_spec("team-a", "tickets", 2, {
        "upstream": {"url": ups.tracker.url}, "prefix": "shadow",
        "tools": [{"name": "search_tickets", "kind": "read"}]})
    await store.put(svc.keys.toolset("team-a", "tickets"), to_json(shadow))
    eventually(lambda: any(r.get("msg") == "toolset from --toolsets-file overrides the "
                           "published one" and r.get("toolset") == "team-a/tickets"
                           for r in svc.proc.logs()), slack(5), "the override logged")
    tools = svc.tools(TOKEN_A)
    assert "tickets.search_tickets" in tools and "shadow.search_tickets" not in tools
    # a malformed record is logged and skipped, never fatal; a deleted one is unserved
    await store.put(svc.keys.toolset("team-a", "broken"), b'{"spec": 1}')
    await store.delete(key)
    await store.delete(svc.keys.toolset("team-a", "tickets"))
    eventually(lambda: "pub.search_tickets" not in svc.tools(TOKEN_A), slack(5), "unpublished")
    assert any(r.get("msg") == "ignoring a malformed published toolset"
               for r in svc.proc.logs())
    assert "tickets.search_tickets" in svc.tools(TOKEN_A)
