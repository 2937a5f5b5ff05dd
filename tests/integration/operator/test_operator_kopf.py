"""The operator end to end on this machine: real kopf (in its own thread and loop, via
`main.operate`), kmock as the Kubernetes API, a real etcd for the published policies."""

from __future__ import annotations

import asyncio
import json
import uuid

import aiohttp
import pytest
from operator_kmock import (
    DEPLOYMENTS,
    EVENTS,
    POLICIES,
    PVCS,
    RESIZE_FORBIDDEN,
    RESIZE_INVALID,
    SERVICE_NS,
    ApiServer,
    bind_claim_and_roll_out,
    create,
    current,
    delete,
    event_reasons,
    eventually,
    got,
    mounted,
    obj,
    patch_spec,
    policy,
    published,
    reason_is,
    roll_out,
    running_operator,
)

from agenttx.contracts.layout import Keys
from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.store.client import Store
from agenttx_operator import conditions, handlers, main, policy_spec, sandboxes
from agenttx_operator.kube import Credentials, KubeClient
from support.waiting import eventually_async, slack

pytestmark = pytest.mark.kmock(cls=ApiServer)


# ---- create / update ---------------------------------------------------------------

async def test_create_publishes_policy_with_generation_and_reports_ready(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    config = make_config()
    async with running_operator(config, api):
        # Liveness endpoint is up while kopf runs (kopf reports ready after its startup
        # handlers, and starts serving /healthz beside them: wait for it).
        async def healthz() -> bool:
            async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{config.liveness_port}/healthz"
            ) as resp:
                return resp.status == 200
        assert await eventually_async(healthz, slack(2), "the liveness endpoint answers 200",
                                      retry_on=(aiohttp.ClientError,))

        await create(api, policy("billing", {
            "priority": 10, "selector": {"agentIdPrefix": "billing-"},
            "rollback": {"maxLocalDepth": 0, "maxGlobalResets": 0}}))
        cond = await eventually(reason_is(api, "billing", "Published"), what="Published")
        assert cond["status"] == "True" and cond["observedGeneration"] == 1

        p = await published(store, etcd_prefix, "billing")
        assert p is not None
        assert (p.generation, p.priority, p.agent_id_prefix) == (1, 10, "billing-")
        assert (p.max_local_depth, p.max_global_resets, p.replay_budget_factor) == (0, 0, None)
        assert p.sandbox_path is None

        body = got(api, POLICIES, "team-a", "billing")
        assert body["status"]["observedGeneration"] == 1
        assert handlers.FINALIZER in body["metadata"]["finalizers"]
        await eventually(lambda: "Published" in event_reasons(api, "billing"), what="event")

        # Update: the new generation is published; no Deployment patch for a policy
        # without a sandbox.
        await patch_spec(api, "billing", {"rollback": {"maxLocalDepth": 5}})
        await eventually(reason_is(api, "billing", "Published", generation=2), what="gen 2")
        p = await current(store, etcd_prefix, "billing")
        assert (p.generation, p.max_local_depth, p.max_global_resets) == (2, 5, 0)
        assert api.json_patches == []


async def test_resume_republishes_nothing_when_nothing_changed(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, caplog
) -> None:
    caplog.set_level("INFO", logger="kopf")
    async with running_operator(make_config(), api):
        await create(api, policy("steady", {"rollback": {"maxLocalDepth": 1}}))
        await eventually(reason_is(api, "steady", "Published"), what="Published")
    first = await store.get(Keys(etcd_prefix).policy("team-a", "steady"))
    status_before = got(api, POLICIES, "team-a", "steady")["status"]

    async with running_operator(make_config(), api):  # operator restart: resume
        await eventually(lambda: "Handler 'agenttxpolicy_resume' succeeded" in caplog.text,
                         what="resume handler")
    again = await store.get(Keys(etcd_prefix).policy("team-a", "steady"))
    assert again.mod_revision == first.mod_revision  # not rewritten
    assert got(api, POLICIES, "team-a", "steady")["status"] == status_before


async def test_prefix_without_a_leading_slash_publishes_where_the_service_watches(
    api: ApiServer, etcd_endpoint: str, store: Store
) -> None:
    """`agenttx operator --etcd-prefix agenttx` and `agenttx serve --etcd-prefix agenttx`
    meet at /agenttx/policies/ (the service's key layout, agenttx.contracts.layout.Keys)."""
    prefix = f"agenttx-{uuid.uuid4().hex[:8]}"
    config = main.parse_config([
        "--etcd-endpoints", etcd_endpoint, "--etcd-prefix", prefix,
        "--service-namespace", SERVICE_NS, "--liveness-host", "127.0.0.1",
        "--liveness-port", str(free_port())])
    watched = Keys(prefix).policies_prefix()
    assert watched == f"/{prefix}/policies/".encode()
    async with running_operator(config, api):
        await create(api, policy("slashless", {"priority": 7}))
        cond = await eventually(reason_is(api, "slashless", "Published"), what="Published")
    assert cond["message"] == f"generation 1 published at /{prefix}/policies/team-a/slashless"
    assert [kv.key for kv in await store.get_prefix(watched)] == [watched + b"team-a/slashless"]
    assert await store.get_prefix(f"{prefix}/".encode()) == []  # nothing outside the layout


# ---- sandbox -----------------------------------------------------------------------

async def test_sandbox_policy_creates_claim_mounts_it_and_publishes_when_bound(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    async with running_operator(make_config(), api):
        await create(api, policy("research", {
            "rollback": {"maxLocalDepth": 2},
            "sandbox": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}))
        claim = sandboxes.claim_name("team-a", "research")

        cond = await eventually(reason_is(api, "research", "VolumePending"), what="pending")
        assert cond["status"] == "False" and claim in cond["message"]
        pvc = got(api, PVCS, SERVICE_NS, claim)
        assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
        assert pvc["metadata"]["annotations"][sandboxes.ANNOTATION_RECLAIM_POLICY] == "Delete"
        dep = got(api, DEPLOYMENTS, SERVICE_NS, "agenttx")
        pod = dep["spec"]["template"]["spec"]
        vname = sandboxes.volume_name("team-a", "research")
        assert {"name": vname, "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
        assert {"name": vname, "mountPath": "/sandboxes/team-a/research"} in \
            pod["containers"][0]["volumeMounts"]
        assert await published(store, etcd_prefix, "research") is None  # not yet usable

        await bind_claim_and_roll_out(api, "team-a", "research")
        await eventually(reason_is(api, "research", "Published"), what="Published")
        p = await current(store, etcd_prefix, "research")
        assert p.sandbox_path == "/sandboxes/team-a/research"
        body = got(api, POLICIES, "team-a", "research")
        assert body["status"]["sandboxClaim"] == f"{SERVICE_NS}/{claim}"
        assert len(api.json_patches) == 1

        # Idempotence: a spec change that keeps the sandbox patches nothing again.
        await patch_spec(api, "research", {"rollback": {"maxLocalDepth": 4}})
        await eventually(reason_is(api, "research", "Published", generation=2), what="gen 2")
        assert len(api.json_patches) == 1
        assert (await current(store, etcd_prefix, "research")).max_local_depth == 4

        # Dropping the sandbox publishes first, then unmounts and deletes the claim.
        await patch_spec(api, "research", {"sandbox": None})
        await eventually(reason_is(api, "research", "Published", generation=3), what="gen 3")
        assert (await current(store, etcd_prefix, "research")).sandbox_path is None
        assert obj(api, PVCS, SERVICE_NS, claim) is None
        pod = got(api, DEPLOYMENTS, SERVICE_NS, "agenttx")["spec"]["template"]["spec"]
        assert [v["name"] for v in pod["volumes"]] == ["tmp"]
        assert [m["name"] for m in pod["containers"][0]["volumeMounts"]] == ["tmp"]


async def test_sandbox_policy_is_not_published_while_an_old_pod_still_serves(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    async with running_operator(make_config(), api):
        await create(api, policy("surge", {"sandbox": {"size": "1Gi"}}))
        await eventually(lambda: mounted(api, "team-a", "surge"), what="mount")
        claim = sandboxes.claim_name("team-a", "surge")
        api.objects[PVCS, SERVICE_NS, claim].patch({"status": {"phase": "Bound"}})
        # Mid-surge: both new pods are up and available, one old pod (no mount) still
        # takes transactions.
        dep = api.objects[DEPLOYMENTS, SERVICE_NS, "agenttx"]
        dep.patch({"status": {"observedGeneration": dep.raw["metadata"]["generation"],
                              "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2}})

        def old_pod_reported() -> bool:
            cond = reason_is(api, "surge", "VolumePending")()
            return bool(cond) and "1 old pod(s) without the sandbox mount" in cond["message"]
        await eventually(old_pod_reported, what="VolumePending naming the old pod")
        assert await published(store, etcd_prefix, "surge") is None

        roll_out(api)  # the old pod is gone
        await eventually(reason_is(api, "surge", "Published"), what="Published")
        assert (await current(store, etcd_prefix, "surge")).sandbox_path == \
            "/sandboxes/team-a/surge"


def event_messages(api: ApiServer, name: str) -> list[str]:
    return [o.raw.get("message", "") for (res, _, _), o in api.objects.items()
            if res == api.resource(EVENTS) and not o.deleted
            and o.raw.get("involvedObject", {}).get("name") == name]


def claim_condition(api: ApiServer, name: str) -> dict | None:
    body = obj(api, POLICIES, "team-a", name) or {}
    for cond in body.get("status", {}).get("conditions", []):
        if cond["type"] == conditions.CONDITION_CLAIM_SYNCED:
            return cond
    return None


@pytest.mark.parametrize("refusal", [RESIZE_FORBIDDEN, RESIZE_INVALID], ids=["403", "422"])
async def test_refused_claim_resize_warns_and_still_publishes_the_rest_of_the_spec(
    api: ApiServer, make_config, store: Store, etcd_prefix: str,
    refusal: tuple[int, str, str]
) -> None:
    async with running_operator(make_config(), api):
        await create(api, policy("grow", {"rollback": {"maxLocalDepth": 1},
                                          "sandbox": {"size": "1Gi"}}))
        claim = sandboxes.claim_name("team-a", "grow")
        await eventually(lambda: obj(api, PVCS, SERVICE_NS, claim), what="claim")
        await bind_claim_and_roll_out(api, "team-a", "grow")
        await eventually(reason_is(api, "grow", "Published"), what="Published")
        assert claim_condition(api, "grow")["status"] == "True"

        # A static PV or a class without expansion: the cluster refuses the bigger size.
        api.refuse_claim_resize = refusal
        await patch_spec(api, "grow", {"rollback": {"maxLocalDepth": 4},
                                       "sandbox": {"size": "2Gi"}})
        cond = await eventually(reason_is(api, "grow", "Published", generation=2),
                                what="generation 2 published despite the refusal")
        assert cond["status"] == "True"
        p = await current(store, etcd_prefix, "grow")
        assert (p.generation, p.max_local_depth) == (2, 4)
        assert p.sandbox_path == "/sandboxes/team-a/grow"
        assert got(api, PVCS, SERVICE_NS, claim)["spec"]["resources"]["requests"] == {
            "storage": "1Gi"}

        synced = claim_condition(api, "grow")
        status, _, message = refusal
        assert synced is not None
        assert (synced["status"], synced["reason"], synced["observedGeneration"]) == (
            "False", "ResizeRefused", 2)
        assert synced["message"] == (
            f"the cluster refused to resize claim {SERVICE_NS}/{claim} from 1Gi to 2Gi "
            f"(HTTP {status}: {message.format(name=claim)}); the sandbox keeps 1Gi")
        await eventually(lambda: "SandboxResizeRefused" in event_reasons(api, "grow"),
                         what="Warning event")

        # Another change while the cluster still refuses: no second Warning. kopf posts
        # events in order, in the background: once this run's Published event is there,
        # a Warning of the same run would be too.
        await patch_spec(api, "grow", {"rollback": {"maxLocalDepth": 5}})
        await eventually(reason_is(api, "grow", "Published", generation=3), what="gen 3")
        await eventually(lambda: any("generation 3 published" in m
                                     for m in event_messages(api, "grow")),
                         what="generation 3 Published event")
        assert event_reasons(api, "grow").count("SandboxResizeRefused") == 1

        # Once the cluster allows it (e.g. the class gained expansion), the next
        # reconcile grows the claim and the condition clears.
        api.refuse_claim_resize = None
        await patch_spec(api, "grow", {"rollback": {"maxLocalDepth": 6}})
        await eventually(reason_is(api, "grow", "Published", generation=4), what="gen 4")
        assert got(api, PVCS, SERVICE_NS, claim)["spec"]["resources"]["requests"] == {
            "storage": "2Gi"}
        synced = claim_condition(api, "grow")
        assert synced is not None
        assert (synced["status"], synced["reason"]) == ("True", "InSync")


@pytest.mark.parametrize("reclaim", ["Delete", "Retain"])
async def test_delete_unpublishes_unmounts_and_reclaims(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, reclaim: str
) -> None:
    async with running_operator(make_config(), api):
        await create(api, policy("tmp", {"sandbox": {"size": "1Gi", "reclaimPolicy": reclaim}}))
        claim = sandboxes.claim_name("team-a", "tmp")
        await eventually(lambda: obj(api, PVCS, SERVICE_NS, claim), what="claim")
        await bind_claim_and_roll_out(api, "team-a", "tmp")
        await eventually(reason_is(api, "tmp", "Published"), what="Published")
        assert await published(store, etcd_prefix, "tmp") is not None

        await delete(api, "tmp")
        await eventually(lambda: obj(api, POLICIES, "team-a", "tmp") is None, what="gone")
        assert await published(store, etcd_prefix, "tmp") is None
        pod = got(api, DEPLOYMENTS, SERVICE_NS, "agenttx")["spec"]["template"]["spec"]
        assert [v["name"] for v in pod["volumes"]] == ["tmp"]
        kept = obj(api, PVCS, SERVICE_NS, claim)
        assert (kept is not None) == (reclaim == "Retain")


# ---- invalid spec ------------------------------------------------------------------

async def test_invalid_policy_reports_invalid_spec_and_publishes_nothing(
    api: ApiServer, make_config, store: Store, etcd_prefix: str
) -> None:
    # kmock has no CRD schema: this is a policy that bypassed it (e.g. an old CRD).
    async with running_operator(make_config(), api):
        await create(api, policy("bad", {"rollback": {"maxLocalDepth": 17},
                                         "sandbox": {"size": "1Gi"}}))
        cond = await eventually(reason_is(api, "bad", "InvalidSpec"), what="InvalidSpec")
        assert cond["status"] == "False"
        assert "spec.rollback.maxLocalDepth" in cond["message"]
        await eventually(lambda: "InvalidSpec" in event_reasons(api, "bad"), what="warning")
        assert await published(store, etcd_prefix, "bad") is None
        assert api.json_patches == []
        assert not [k for k in api.objects if k[0] == api.resource(PVCS)]

        # Fixing the spec (a new generation) publishes it.
        await patch_spec(api, "bad", {"rollback": {"maxLocalDepth": 16}, "sandbox": None})
        await eventually(reason_is(api, "bad", "Published", generation=2), what="fixed")
        assert (await current(store, etcd_prefix, "bad")).max_local_depth == 16


# ---- etcd unavailable --------------------------------------------------------------

async def test_etcd_down_reports_etcd_unavailable_and_retries_until_it_is_back(
    api: ApiServer, make_config, store: Store, scratch, etcd_prefix: str
) -> None:
    port = free_port()
    config = make_config(etcd_endpoints=[f"127.0.0.1:{port}"], etcd_timeout_s=0.3)
    async with running_operator(config, api):
        await create(api, policy("later", {"rollback": {"maxGlobalResets": 3}}))
        cond = await eventually(reason_is(api, "later", "EtcdUnavailable"), what="unavailable")
        assert cond["status"] == "False" and "will retry" in cond["message"]
        await eventually(lambda: "EtcdUnavailable" in event_reasons(api, "later"),
                         what="warning event")

        late = EmbeddedEtcd(scratch / f"late-{port}", client_ports=[port]).start()
        try:
            await eventually(reason_is(api, "later", "Published"), timeout=20,
                             what="published after etcd came back")
            from agenttx.store.client import connect
            s = connect([f"127.0.0.1:{port}"])
            try:
                p = await published(s, etcd_prefix, "later")
            finally:
                await s.close()
            assert p is not None and p.max_global_resets == 3
        finally:
            late.stop()


async def test_delete_with_etcd_down_releases_the_finalizer_and_the_sweep_unpublishes(
    api: ApiServer, make_config, store: Store, etcd_prefix: str, etcd_endpoint: str
) -> None:
    async with running_operator(make_config(), api):
        await create(api, policy("orphan", {}))
        await eventually(reason_is(api, "orphan", "Published"), what="Published")
    assert await published(store, etcd_prefix, "orphan") is not None

    dead = make_config(etcd_endpoints=[f"127.0.0.1:{free_port()}"], etcd_timeout_s=0.3,
                       delete_etcd_attempts=2)
    async with running_operator(dead, api):
        await delete(api, "orphan")
        await eventually(lambda: obj(api, POLICIES, "team-a", "orphan") is None, timeout=20,
                         what="finalizer released")
        assert "EtcdUnavailable" in event_reasons(api, "orphan")
    assert await published(store, etcd_prefix, "orphan") is not None  # left behind...

    config = make_config()
    kube = KubeClient(Credentials(server=str(api.url).rstrip("/")))
    rt = handlers.Runtime(config=config, target=main.build_target(config), store=store,
                          kube=kube)
    try:
        removed = await handlers.sweep_once(rt)  # ...until the sweep runs
    finally:
        await kube.close()
    assert removed == [Keys(etcd_prefix).policy("team-a", "orphan")]
    assert await published(store, etcd_prefix, "orphan") is None


# ---- startup ---------------------------------------------------------------------

async def test_operator_refuses_to_start_without_the_crd(
    api: ApiServer, etcd_endpoint: str, tmp_path, monkeypatch, caplog
) -> None:
    """`agenttx operator` exits non-zero (the pod restarts until the CRD exists); this
    also drives `run()` through real kubeconfig credential loading."""
    del api.resources[POLICIES]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(api.url).rstrip("/")}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # kopf.configure() rewires the root logger for the whole process: not in a test run.
    monkeypatch.setattr(main, "_configure_logging", lambda config: None)
    argv = ["--etcd-endpoints", etcd_endpoint, "--service-namespace", SERVICE_NS,
            "--liveness-host", "127.0.0.1", "--liveness-port", str(free_port())]
    code = await asyncio.wait_for(asyncio.to_thread(main.run, argv), timeout=15)
    assert code == 1
    assert "install the CRD" in caplog.text
    assert any(r.headers.get("Authorization") == "Bearer t0ken" for r in list(api))


def test_run_rejects_missing_etcd_endpoints(capsys, monkeypatch) -> None:
    monkeypatch.delenv("AGENTTX_OPERATOR_ETCD_ENDPOINTS", raising=False)
    assert main.run(["--service-namespace", "x"]) == 2
    assert "etcd_endpoints" in capsys.readouterr().err


def test_published_json_is_what_the_service_parses() -> None:
    spec = {"priority": 1, "rollback": {"replayBudgetFactor": 2}}
    raw = policy_spec.publish_payload(policy_spec.normalise("n", "p", 3, spec))
    assert json.loads(raw)["rollback"] == {"replay_budget_factor": 2.0}
