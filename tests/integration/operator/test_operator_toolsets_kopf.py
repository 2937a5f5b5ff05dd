"""AgentTxToolset end to end on this machine: real kopf (in its own thread and loop, via
`main.operate`), kmock as the Kubernetes API, a real etcd for what is published, and a
real MCP server (tests/support/mcp_upstreams.py, the official SDK) as the upstream that
the operator asks for tools/list with the toolset's Secret-backed header.

Every test that uses a header also checks that its value is nowhere but in the two
Secrets (the user's, and the operator's copy in the service namespace): not in etcd, the
toolset's status, any event, or a log line of the operator or kopf."""

from __future__ import annotations

import asyncio
import base64
import logging

import pytest
from operator_kmock import (
    DEPLOYMENTS,
    SECRETS,
    SERVICE_NS,
    TOOLSETS,
    ApiServer,
    create_toolset,
    delete_toolset,
    events_of,
    got,
    obj,
    patch_toolset,
    put_secret,
    roll_out,
    running_operator,
    secret,
    toolset,
    toolset_reason_is,
)
from upstream_gate import Gate, gate

from agenttx.contracts.layout import Keys
from agenttx.contracts.toolsets import Toolset, parse_published
from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.store.client import Store, connect
from agenttx_operator import handlers, main, projection
from agenttx_operator.kube import Credentials, KubeClient
from support.mcp_upstreams import Upstream, tracker
from support.waiting import eventually_async, slack

pytestmark = pytest.mark.kmock(cls=ApiServer)

TOKEN = "Bearer tk-7f3c9a1e5b2d-never-leaks"
COPY = projection.secret_name("team-a", "tickets")
MOUNT = "/etc/agenttx/toolsets/team-a/tickets"


def gated_tracker(required: dict[str, str] | None = None) -> tuple[Upstream, Gate]:
    """The ticket tracker behind a gateway that records every request's headers (and,
    with `required`, answers 401 without them)."""
    up = tracker()
    return up, gate(up, required)


def tickets_spec(url: str, *, headers: bool = True, **extra: object) -> dict:
    spec: dict = {
        "upstream": {"url": url, "timeoutSeconds": 2},
        "prefix": "tickets",
        "tools": [
            {"name": "create_ticket", "kind": "saga",
             "compensate": {"tool": "close_ticket",
                            "arguments": {"id": "${output.id}", "reason": "rolled back"}}},
            {"name": "search_tickets", "kind": "read"},
            {"name": "add_comment", "kind": "saga",
             "compensate": {"tool": "delete_comment",
                            "arguments": {"id": "${arguments.id}",
                                          "text": "${arguments.text}"}}},
        ],
    }
    if headers:
        spec["upstream"]["headers"] = [
            {"name": "Authorization", "secretKeyRef": {"name": "tickets-token", "key": "header"}}]
    spec.update(extra)
    return spec


async def published(store: Store, prefix: str, name: str = "tickets", ns: str = "team-a"
                    ) -> Toolset | None:
    kv = await store.get(Keys(prefix).toolset(ns, name))
    return parse_published(kv.value) if kv else None


def settle(config) -> float:
    """A deadline for one reconcile cycle with the test's retry settings."""
    return slack(config.upstream_retry_max_s + config.volume_poll_s + 2)


async def reason(api: ApiServer, config, reason_: str, generation: int | None = None,
                 name: str = "tickets", ns: str = "team-a", message: str | None = None
                 ) -> dict:
    """Wait for the Ready reason (and generation, and message, when given)."""
    check = toolset_reason_is(api, name, reason_, generation, ns)

    async def found() -> dict | None:
        cond = check()
        return cond if cond and message in (None, cond["message"]) else None
    return await eventually_async(found, settle(config),
                                  f"toolset {name} Ready reason {reason_} (gen {generation}"
                                  f"{', ' + repr(message) if message else ''})")


def mounted_items(api: ApiServer) -> list[dict] | None:
    pod = got(api, DEPLOYMENTS, SERVICE_NS, "agenttx")["spec"]["template"]["spec"]
    for v in pod.get("volumes") or []:
        if v["name"] == projection.volume_name("team-a", "tickets"):
            return v["secret"]["items"]
    return None


async def assert_no_secret_outside_secrets(api: ApiServer, store: Store, prefix: str,
                                           caplog: pytest.LogCaptureFixture, *values: str
                                           ) -> None:
    """Each value (and its base64) appears in no etcd key or value, no object of the API
    server but Secrets, and no log record."""
    forms = [v for value in values
             for v in (value, base64.b64encode(value.encode()).decode())]
    etcd = b"".join(kv.key + kv.value for kv in await store.get_prefix(prefix.encode()))
    assert etcd, "nothing published: the check would be empty"
    objects = [repr(o.raw) for (res, _, _), o in list(api.objects.items())
               if res != api.resource(SECRETS)]
    logs = "\n".join(r.getMessage() + repr(getattr(r, "__dict__", {}))
                     for r in caplog.records)
    for form in forms:
        assert form.encode() not in etcd
        assert not [o for o in objects if form in o], form
        assert form not in logs


# ---- create ---------------------------------------------------------------------------

async def test_toolset_with_a_secret_header_is_checked_projected_published_and_ready(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    config = make_config()
    await put_secret(api, secret("tickets-token", {"header": TOKEN + "\n", "unused": "x"}))
    up, gw = gated_tracker({"Authorization": TOKEN})
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url)))

            # The header files are mounted; nothing is published before every pod has them.
            cond = await reason(api, config, "ProjectionPending")
            assert cond["status"] == "False"
            assert cond["message"] == ("the service Deployment has not observed the toolset's "
                                       "header files yet")
            assert await published(store, etcd_prefix) is None
            # The operator asked the upstream with the Secret's value (newline dropped).
            assert gw.saw("Authorization", TOKEN)

            roll_out(api)
            cond = await reason(api, config, "Published")
            assert cond["status"] == "True" and cond["observedGeneration"] == 1
            assert cond["message"] == (
                f"generation 1 published at {etcd_prefix}/toolsets/team-a/tickets: "
                "tickets.create_ticket, tickets.search_tickets, tickets.add_comment")

            t = await published(store, etcd_prefix)
            assert t is not None and (t.generation, t.prefix) == (1, "tickets")
            assert [(h.name, h.file, h.value) for h in t.upstream.headers] == [
                ("Authorization", f"{MOUNT}/tickets-token/header", None)]
            assert [(s.name, s.kind) for s in t.tools] == [
                ("create_ticket", "saga"), ("search_tickets", "read"), ("add_comment", "saga")]

            body = got(api, TOOLSETS, "team-a", "tickets")
            assert body["status"]["publishedGeneration"] == 1
            assert body["status"]["tools"] == 3
            assert body["status"]["headerSecret"] == f"{SERVICE_NS}/{COPY}"
            assert handlers.FINALIZER in body["metadata"]["finalizers"]

            # The copy holds exactly the key the header names, as the user's Secret has it.
            copy = got(api, SECRETS, SERVICE_NS, COPY)
            user = got(api, SECRETS, "team-a", "tickets-token")
            assert copy["data"] == {"tickets-token_header": user["data"]["header"]}
            assert copy["metadata"]["annotations"] == {"agenttx.io/toolset": "team-a/tickets"}

            # Mounted read-only, group-readable only, into the service container.
            pod = got(api, DEPLOYMENTS, SERVICE_NS, "agenttx")["spec"]["template"]["spec"]
            vname = projection.volume_name("team-a", "tickets")
            assert {"name": vname, "secret": {
                "secretName": COPY, "defaultMode": 0o440, "optional": True,
                "items": [{"key": "tickets-token_header", "path": "tickets-token/header"}]},
            } in pod["volumes"]
            assert {"name": vname, "mountPath": MOUNT, "readOnly": True} in \
                pod["containers"][0]["volumeMounts"]

            async def published_event() -> list[str]:
                return [e["reason"] for e in events_of(api, "tickets")
                        if e["reason"] == "Published"]
            await eventually_async(published_event, slack(2), "Published event")
            reasons = [e["reason"] for e in events_of(api, "tickets")]
            assert {"HeaderSecretCreated", "HeaderFilesMounted"} <= set(reasons)
    await assert_no_secret_outside_secrets(api, store, etcd_prefix, caplog, TOKEN)


async def test_toolset_without_headers_is_published_without_touching_the_deployment(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config()
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url,
                                                                      headers=False)))
            await reason(api, config, "Published")
    t = await published(store, etcd_prefix)
    assert t is not None and t.upstream.headers == ()
    assert api.json_patches == []
    assert obj(api, SECRETS, SERVICE_NS, COPY) is None
    assert got(api, TOOLSETS, "team-a", "tickets")["status"]["headerSecret"] == ""


# ---- what keeps a toolset from being published -----------------------------------------

async def test_invalid_spec_names_the_field_and_publishes_nothing(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    # kmock has no CRD schema: a toolset that bypassed it (e.g. an old CRD).
    config = make_config()
    spec = tickets_spec("http://127.0.0.1:9/mcp", headers=False)
    del spec["tools"][0]["compensate"]
    async with running_operator(config, api):
        await create_toolset(api, toolset("tickets", spec))
        cond = await reason(api, config, "InvalidSpec")
        assert cond["status"] == "False"
        assert cond["message"] == ("spec.tools[0].compensate is required for kind saga (how "
                                   "is create_ticket undone?)")

        async def warned() -> bool:
            return "InvalidSpec" in [e["reason"] for e in events_of(api, "tickets")]
        await eventually_async(warned, slack(2), "InvalidSpec Warning event")
    assert await published(store, etcd_prefix) is None
    assert got(api, TOOLSETS, "team-a", "tickets")["status"]["tools"] == 0


async def test_an_upstream_without_a_listed_tool_is_unknown_tool_naming_it(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config()
    spec = tickets_spec("", headers=False)
    spec["tools"].append({"name": "reopen_ticket", "kind": "read"})
    spec["tools"][2]["compensate"]["tool"] = "remove_comment"
    up, gw = gated_tracker()
    with up:
        spec["upstream"]["url"] = up.url
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", spec))
            cond = await reason(api, config, "UnknownTool")
    assert cond["message"].startswith(
        f"{up.url} has no tool remove_comment, reopen_ticket (it lists add_comment, "
        "close_ticket, create_ticket, delete_comment, search_tickets, tracker_status); will "
        "check again")
    assert await published(store, etcd_prefix) is None


async def test_a_missing_secret_is_secret_not_found_until_it_exists(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    config = make_config()
    up, gw = gated_tracker({"Authorization": TOKEN})
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url)))
            cond = await reason(api, config, "SecretNotFound")
            assert cond["message"] == "Secret team-a/tickets-token does not exist"

            await put_secret(api, secret("tickets-token", {"other": "x"}))
            await reason(api, config, "SecretNotFound",
                         message="Secret team-a/tickets-token has no key 'header'")

            await put_secret(api, secret("tickets-token", {"header": "Bearer a\nb"}))
            await reason(api, config, "SecretInvalid", message=(
                "key 'header' of Secret team-a/tickets-token contains a control character "
                "(e.g. a line break inside it); an HTTP header value cannot"))

            # The retry with backoff picks the fixed Secret up: no change to the toolset.
            await put_secret(api, secret("tickets-token", {"header": TOKEN}))
            await reason(api, config, "ProjectionPending")
            roll_out(api)
            await reason(api, config, "Published")
    assert await published(store, etcd_prefix) is not None
    await assert_no_secret_outside_secrets(api, store, etcd_prefix, caplog, TOKEN)


async def test_a_wrong_header_value_is_upstream_unreachable_with_the_http_status(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    config = make_config()
    wrong = "Bearer tk-wrong-0d9e8c7b6a5f"
    await put_secret(api, secret("tickets-token", {"header": wrong}))
    up, gw = gated_tracker({"Authorization": TOKEN})
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url)))
            cond = await reason(api, config, "UpstreamUnreachable")
    assert cond["message"] == (f"tools/list failed: {up.url} answered HTTP 401 "
                               "Unauthorized; will retry")
    assert await published(store, etcd_prefix) is None
    assert obj(api, SECRETS, SERVICE_NS, COPY) is None  # nothing projected for it
    assert api.json_patches == []
    objects = [repr(o.raw) for (res, _, _), o in list(api.objects.items())
               if res != api.resource(SECRETS)]
    assert not [o for o in objects if wrong in o]
    assert wrong not in caplog.text


async def test_unreachable_upstream_keeps_the_published_generation_and_retries(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config()
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url,
                                                                      headers=False)))
            await reason(api, config, "Published", generation=1)

            up.down()  # the upstream goes down; a new generation cannot be checked
            spec = tickets_spec(up.url, headers=False)
            spec["tools"].append({"name": "close_ticket", "kind": "read"})
            await patch_toolset(api, "tickets", {"tools": spec["tools"]})
            cond = await reason(api, config, "UpstreamUnreachable", generation=2)
            assert cond["status"] == "False"
            assert cond["message"].startswith(f"tools/list failed: {up.url}: cannot connect")
            assert cond["message"].endswith("; will retry; generation 1 stays published")
            t = await published(store, etcd_prefix)
            assert t is not None and t.generation == 1 and len(t.tools) == 3
            body = got(api, TOOLSETS, "team-a", "tickets")
            assert (body["status"]["publishedGeneration"], body["status"]["tools"]) == (1, 3)

            up.up()  # back on the same port: the retry publishes generation 2
            await reason(api, config, "Published", generation=2)
    t = await published(store, etcd_prefix)
    assert t is not None and t.generation == 2 and len(t.tools) == 4
    assert got(api, TOOLSETS, "team-a", "tickets")["status"]["tools"] == 4


async def test_a_prefix_taken_in_the_namespace_is_refused_until_the_holder_goes(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config(toolset_resync_s=0.5)
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url,
                                                                      headers=False)))
            await reason(api, config, "Published")
            await create_toolset(api, toolset("tickets-2", tickets_spec(up.url,
                                                                        headers=False)))
            cond = await reason(api, config, "InvalidSpec", name="tickets-2")
            assert cond["message"] == (
                "spec.prefix 'tickets' is already used by AgentTxToolset team-a/tickets (the "
                "older toolset keeps it); choose another prefix")
            assert await published(store, etcd_prefix, "tickets-2") is None
            # The same prefix in another namespace is no conflict.
            await create_toolset(api, toolset("tickets", tickets_spec(
                up.url, headers=False), namespace="team-b"))
            await reason(api, config, "Published", name="tickets", ns="team-b")

            # Once the holder is deleted, the periodic re-check accepts the other one.
            await delete_toolset(api, "tickets")
            await reason(api, config, "Published", name="tickets-2")
    assert await published(store, etcd_prefix, "tickets") is None
    assert await published(store, etcd_prefix, "tickets-2") is not None
    assert await published(store, etcd_prefix, "tickets", ns="team-b") is not None


async def test_etcd_down_is_etcd_unavailable_until_it_is_back(
    api: ApiServer, make_config, scratch, etcd_prefix: str
) -> None:
    port = free_port()
    config = make_config(etcd_endpoints=[f"127.0.0.1:{port}"], etcd_timeout_s=0.3)
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url,
                                                                      headers=False)))
            cond = await reason(api, config, "EtcdUnavailable")
            assert cond["message"].startswith("cannot publish to etcd (will retry): ")
            late = EmbeddedEtcd(scratch / f"late-toolset-{port}", client_ports=[port]).start()
            try:
                await eventually_async(
                    lambda: _ready(api, "Published"),
                    slack(config.etcd_retry_max_s + 5), "Published once etcd is back")
                late_store = connect([f"127.0.0.1:{port}"])
                try:
                    t = await published(late_store, etcd_prefix)
                finally:
                    await late_store.close()
                assert t is not None and t.generation == 1
            finally:
                late.stop()


async def _ready(api: ApiServer, reason_: str) -> dict | None:
    return toolset_reason_is(api, "tickets", reason_)()


# ---- changes over time --------------------------------------------------------------------

async def test_a_rotated_secret_value_reaches_the_copy_without_a_rollout(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    config = make_config(toolset_resync_s=0.5)
    rotated = "Bearer tk-rotated-4a4b4c4d"
    await put_secret(api, secret("tickets-token", {"header": TOKEN}))
    up, gw = gated_tracker({"Authorization": TOKEN})
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url)))
            await reason(api, config, "ProjectionPending")
            roll_out(api)
            await reason(api, config, "Published")
            before = await store.get(Keys(etcd_prefix).toolset("team-a", "tickets"))
            patches = len(api.json_patches)

            gw.required["Authorization"] = rotated
            await put_secret(api, secret("tickets-token", {"header": rotated}))

            async def copied() -> bool:
                copy = got(api, SECRETS, SERVICE_NS, COPY)
                return copy["data"] == {
                    "tickets-token_header": base64.b64encode(rotated.encode()).decode()}
            await eventually_async(copied, slack(config.toolset_resync_s + 2),
                                   "the rotated value in the operator's copy")
            await reason(api, config, "Published")
            assert gw.saw("Authorization", rotated)
    # Same files, same published record: nothing rolled, nothing rewritten.
    assert len(api.json_patches) == patches
    after = await store.get(Keys(etcd_prefix).toolset("team-a", "tickets"))
    assert after is not None and before is not None
    assert after.mod_revision == before.mod_revision
    await assert_no_secret_outside_secrets(api, store, etcd_prefix, caplog, TOKEN, rotated)


async def test_dropping_the_header_publishes_first_then_unmounts_and_deletes_the_copy(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config()
    await put_secret(api, secret("tickets-token", {"header": TOKEN}))
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url)))
            await reason(api, config, "ProjectionPending")
            roll_out(api)
            await reason(api, config, "Published", generation=1)
            assert mounted_items(api) is not None

            await patch_toolset(api, "tickets", {"upstream": {"url": up.url,
                                                              "timeoutSeconds": 2,
                                                              "headers": None}})
            await reason(api, config, "Published", generation=2)
            t = await published(store, etcd_prefix)
            assert t is not None and t.generation == 2 and t.upstream.headers == ()

            async def gone() -> bool:
                return (mounted_items(api) is None
                        and obj(api, SECRETS, SERVICE_NS, COPY) is None)
            await eventually_async(gone, settle(config), "volume and copy removed")
    assert got(api, TOOLSETS, "team-a", "tickets")["status"]["headerSecret"] == ""


async def test_a_second_header_keeps_the_first_file_until_the_new_generation_is_published(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config()
    await put_secret(api, secret("tickets-token", {"header": TOKEN, "tenant": "team-a"}))
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url)))
            await reason(api, config, "ProjectionPending")
            roll_out(api)
            await reason(api, config, "Published", generation=1)

            # Generation 2 reads the tenant from another key and no longer sends the token.
            await patch_toolset(api, "tickets", {"upstream": {
                "url": up.url, "timeoutSeconds": 2,
                "headers": [{"name": "X-Tenant",
                             "secretKeyRef": {"name": "tickets-token", "key": "tenant"}}]}})
            cond = await reason(api, config, "ProjectionPending", generation=2)
            assert cond["message"].endswith("; generation 1 stays published")
            # While generation 1 is served, its file stays in the template and the copy.
            assert [i["path"] for i in mounted_items(api) or []] == [
                "tickets-token/header", "tickets-token/tenant"]
            assert sorted(got(api, SECRETS, SERVICE_NS, COPY)["data"]) == [
                "tickets-token_header", "tickets-token_tenant"]

            roll_out(api)
            await reason(api, config, "Published", generation=2)

            async def pruned() -> bool:
                return ([i["path"] for i in mounted_items(api) or []] == ["tickets-token/tenant"]
                        and sorted(got(api, SECRETS, SERVICE_NS, COPY)["data"])
                        == ["tickets-token_tenant"])
            await eventually_async(pruned, settle(config), "the unused header file dropped")
    t = await published(store, etcd_prefix)
    assert t is not None and [(h.name, h.file) for h in t.upstream.headers] == [
        ("X-Tenant", f"{MOUNT}/tickets-token/tenant")]


# ---- delete ----------------------------------------------------------------------------

async def test_delete_unpublishes_unmounts_and_deletes_the_copy(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config()
    await put_secret(api, secret("tickets-token", {"header": TOKEN}))
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url)))
            await reason(api, config, "ProjectionPending")
            roll_out(api)
            await reason(api, config, "Published")

            await delete_toolset(api, "tickets")

            async def deleted() -> bool:
                return obj(api, TOOLSETS, "team-a", "tickets") is None
            await eventually_async(deleted, settle(config), "toolset deleted")
    assert await published(store, etcd_prefix) is None
    assert mounted_items(api) is None
    pod = got(api, DEPLOYMENTS, SERVICE_NS, "agenttx")["spec"]["template"]["spec"]
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == ["tmp"]
    assert obj(api, SECRETS, SERVICE_NS, COPY) is None
    assert obj(api, SECRETS, "team-a", "tickets-token") is not None  # the user's stays
    assert "Unpublished" in [e["reason"] for e in events_of(api, "tickets")]


async def test_orphan_sweep_unpublishes_a_toolset_whose_resource_is_gone(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    """A key left behind (the finalizer gave up while etcd was down) goes with the sweep;
    a live toolset's key stays."""
    config = make_config()
    up, gw = gated_tracker()
    with up:
        async with running_operator(config, api):
            await create_toolset(api, toolset("tickets", tickets_spec(up.url,
                                                                      headers=False)))
            await reason(api, config, "Published")
    keys = Keys(etcd_prefix)
    live = await store.get(keys.toolset("team-a", "tickets"))
    assert live is not None
    await store.put(keys.toolset("team-a", "gone"), live.value)

    kube = KubeClient(Credentials(server=str(api.url).rstrip("/")))
    rt = handlers.Runtime(config=config, target=main.build_target(config), store=store,
                          kube=kube)
    try:
        removed = await handlers.sweep_toolsets_once(rt)
    finally:
        await kube.close()
    assert removed == [keys.toolset("team-a", "gone")]
    assert await store.get(keys.toolset("team-a", "tickets")) is not None


# ---- startup -------------------------------------------------------------------------

async def test_operator_refuses_to_start_without_the_toolset_crd(
    api: ApiServer, make_config, caplog
) -> None:
    """Like without the policy CRD: the process ends (the pod restarts visibly) instead
    of serving policies while toolsets silently go unreconciled."""
    del api.resources[TOOLSETS]
    config = make_config()
    credentials = Credentials(server=str(api.url).rstrip("/"))
    with pytest.raises(Exception) as exc:
        await asyncio.wait_for(asyncio.to_thread(
            asyncio.run, main.operate(config, credentials=credentials)), timeout=slack(10))
    assert "agenttxtoolsets.agenttx.io/v1alpha1: install the CRD (crds/) first" in (
        str(exc.value) + caplog.text)
