"""Pure functions of the operator for AgentTxToolset (`toolset_spec`, `projection`,
`toolset_status`, `mounts.volume_patch`, `lifecycle.orphaned_toolset_keys`): no kopf, API
server, etcd or upstream."""

from __future__ import annotations

import copy
import re

import jsonpatch
import pytest

from agenttx.contracts.layout import Keys
from agenttx.contracts.toolsets import ToolsetError, parse_published, to_json
from agenttx_operator import lifecycle, mounts, projection, toolset_spec, toolset_status
from agenttx_operator.sandboxes import Target
from agenttx_operator.toolset_spec import SecretRef

TARGET = Target(service_namespace="agenttx-system", deployment="agenttx", container="agenttx")
NOW = "2030-01-01T00:00:00Z"
LATER = "2030-01-01T00:05:00Z"


def spec(**upstream: object) -> dict:
    return {
        "upstream": {"url": "http://tickets.team-a.svc:8080/mcp",
                     "headers": [
                         {"name": "Authorization",
                          "secretKeyRef": {"name": "tickets-token", "key": "header"}},
                         {"name": "X-Tenant",
                          "secretKeyRef": {"name": "tickets-token", "key": "tenant"}},
                         {"name": "X-Region",
                          "secretKeyRef": {"name": "region", "key": "name"}},
                     ], **upstream},
        "prefix": "tickets",
        "tools": [
            {"name": "create_ticket", "kind": "saga",
             "compensate": {"tool": "close_ticket", "arguments": {"id": "${output.id}"}}},
            {"name": "search_tickets", "kind": "read"},
        ],
    }


def deployment() -> dict:
    return {
        "metadata": {"name": "agenttx", "namespace": "agenttx-system", "generation": 3},
        "spec": {"replicas": 2, "template": {"spec": {
            "containers": [{"name": "sidecar", "image": "x"},
                           {"name": "agenttx", "image": "agenttx:1",
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
            "volumes": [{"name": "tmp", "emptyDir": {}}]}}},
        "status": {"observedGeneration": 3, "updatedReplicas": 2, "replicas": 2,
                   "availableReplicas": 2},
    }


# ---- the spec ------------------------------------------------------------------------

def test_parse_names_each_header_by_the_file_its_secret_key_is_projected_to() -> None:
    t = toolset_spec.parse("team-a", "tickets", 4, spec())
    assert t.generation == 4 and t.key == "team-a/tickets"
    assert [(h.name, h.file, h.value) for h in t.upstream.headers] == [
        ("Authorization", "/etc/agenttx/toolsets/team-a/tickets/tickets-token/header", None),
        ("X-Tenant", "/etc/agenttx/toolsets/team-a/tickets/tickets-token/tenant", None),
        ("X-Region", "/etc/agenttx/toolsets/team-a/tickets/region/name", None),
    ]
    # What is published names files only, and reads back the same.
    assert parse_published(to_json(t)) == t
    other_root = toolset_spec.parse("team-a", "tickets", 4, spec(), mount_root="/srv/h/")
    assert other_root.upstream.headers[0].file == "/srv/h/team-a/tickets/tickets-token/header"


@pytest.mark.parametrize(("header", "message"), [
    ({"name": "Authorization", "value": "Bearer x"},
     "spec.upstream.headers[0].value is not allowed here: take the value from a Secret"),
    ({"name": "Authorization", "file": "/etc/passwd"},
     "spec.upstream.headers[0].file is for toolsets files; in an AgentTxToolset take the "
     "value from a Secret (secretKeyRef)"),
    ({"name": "Content-Type", "secretKeyRef": {"name": "s", "key": "k"}},
     "spec.upstream.headers[0].name 'Content-Type' is set by AgentTx and may not be given"),
])
def test_parse_takes_header_values_from_secrets_only(header: dict, message: str) -> None:
    s = spec()
    s["upstream"]["headers"] = [header]
    with pytest.raises(ToolsetError) as exc:
        toolset_spec.parse("team-a", "tickets", 1, s)
    assert str(exc.value) == message
    assert "Bearer x" not in str(exc.value)


def test_secret_refs_are_unique_in_order_and_tolerate_any_spec() -> None:
    s = spec()
    s["upstream"]["headers"].append(
        {"name": "X-Again", "secretKeyRef": {"name": "tickets-token", "key": "header"}})
    assert toolset_spec.secret_refs(s) == (
        SecretRef("tickets-token", "header"), SecretRef("tickets-token", "tenant"),
        SecretRef("region", "name"))
    for junk in (None, [], {"upstream": "x"}, {"upstream": {"headers": [1, {"name": "a"},
                                                                         {"secretKeyRef": {}}]}}):
        assert toolset_spec.secret_refs(junk) == ()


def test_missing_tools_include_compensation_tools() -> None:
    t = toolset_spec.parse("team-a", "tickets", 1, spec())
    assert toolset_spec.missing_tools(t, {"create_ticket", "search_tickets"}) == ["close_ticket"]
    assert toolset_spec.missing_tools(t, {"search_tickets", "other"}) == [
        "close_ticket", "create_ticket"]
    assert toolset_spec.missing_tools(
        t, {"create_ticket", "close_ticket", "search_tickets", "more"}) == []


def item(name: str, prefix: str, created: str, ns: str = "team-a", **meta: object) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": created, **meta},
            "spec": {"prefix": prefix}}


def test_the_oldest_toolset_holds_a_prefix() -> None:
    old = item("old", "tickets", "2030-01-01T00:00:00Z")
    new = item("new", "tickets", "2030-01-02T00:00:00Z")
    other = item("mail", "mail", "2029-01-01T00:00:00Z")
    assert toolset_spec.prefix_owner(new, [old, new, other]) == "old"
    assert toolset_spec.prefix_owner(old, [old, new, other]) is None
    # Created in the same second: the name decides, the same way for both.
    a, b = (item(n, "tickets", "2030-01-01T00:00:00Z") for n in ("a", "b"))
    assert toolset_spec.prefix_owner(b, [a, b]) == "a"
    assert toolset_spec.prefix_owner(a, [a, b]) is None


def test_a_prefix_is_not_held_from_another_namespace_or_by_a_toolset_being_deleted() -> None:
    new = item("new", "tickets", "2030-01-02T00:00:00Z")
    elsewhere = item("old", "tickets", "2030-01-01T00:00:00Z", ns="team-b")
    leaving = item("gone", "tickets", "2030-01-01T00:00:00Z",
                   deletionTimestamp="2030-01-03T00:00:00Z")
    assert toolset_spec.prefix_owner(new, [elsewhere, leaving]) is None


# ---- the copy and its volume ------------------------------------------------------------

def test_names_are_dns_safe_bounded_and_distinct() -> None:
    for ns, name in (("team-a", "tickets"), ("a" * 63, "b" * 253), ("t", "x.y")):
        secret, volume = projection.secret_name(ns, name), projection.volume_name(ns, name)
        assert len(secret) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", secret)
        assert len(volume) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", volume)
    assert projection.secret_name("a-b", "c") != projection.secret_name("a", "b-c")
    assert projection.volume_name("team-a", "tickets").startswith("tset-team-a-tickets-")


def test_copy_keys_are_unique_valid_and_bounded() -> None:
    assert projection.copy_key(SecretRef("tickets-token", "header")) == "tickets-token_header"
    # A Secret name has no "_": the first one separates, so no two refs share a key.
    assert projection.copy_key(SecretRef("a", "b_c")) != projection.copy_key(SecretRef("a-b", "c"))
    long = projection.copy_key(SecretRef("s" * 253, "k" * 253))
    assert len(long) <= projection.MAX_KEY_LEN and re.fullmatch(r"[-._a-zA-Z0-9]+", long)
    assert long != projection.copy_key(SecretRef("s" * 253, "k" * 252))


def test_build_secret_holds_exactly_the_named_keys_as_served() -> None:
    values = {SecretRef("tickets-token", "header"): "QmVhcmVyIHg=",
              SecretRef("region", "name"): "ZXU="}
    secret = projection.build_secret("team-a", "tickets", values, TARGET,
                                     keep={"old_key": "b2xk"})
    assert secret["metadata"]["namespace"] == "agenttx-system"
    assert secret["metadata"]["name"] == projection.secret_name("team-a", "tickets")
    assert secret["metadata"]["annotations"] == {"agenttx.io/toolset": "team-a/tickets"}
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agenttx-operator"
    assert secret["data"] == {"tickets-token_header": "QmVhcmVyIHg=", "region_name": "ZXU=",
                              "old_key": "b2xk"}
    assert secret["type"] == "Opaque"


def test_secret_patch_adds_changes_and_removes_keys_and_is_none_when_equal() -> None:
    desired = projection.build_secret("team-a", "tickets",
                                      {SecretRef("s", "a"): "MQ==", SecretRef("s", "b"): "Mg=="},
                                      TARGET)
    assert projection.secret_patch(copy.deepcopy(desired), desired) is None
    live = copy.deepcopy(desired)
    live["data"] = {"s_a": "OQ==", "s_gone": "eA=="}
    live["metadata"]["annotations"] = {}
    assert projection.secret_patch(live, desired) == {
        "data": {"s_a": "MQ==", "s_b": "Mg==", "s_gone": None},
        "metadata": {"annotations": {"agenttx.io/toolset": "team-a/tickets"}}}


def test_items_are_sorted_by_path_and_merge_keeps_both_generations() -> None:
    new = projection.items([SecretRef("t", "tenant"), SecretRef("r", "name")])
    assert new == [{"key": "r_name", "path": "r/name"}, {"key": "t_tenant", "path": "t/tenant"}]
    old = projection.items([SecretRef("t", "header")])
    assert [i["path"] for i in projection.merge_items(old, new)] == [
        "r/name", "t/header", "t/tenant"]
    assert projection.merge_items(new, new) == new


def test_volume_and_mount_are_read_only_group_readable_and_optional() -> None:
    items = projection.items([SecretRef("t", "header")])
    vol = projection.volume("team-a", "tickets", items)
    assert vol == {"name": projection.volume_name("team-a", "tickets"), "secret": {
        "secretName": projection.secret_name("team-a", "tickets"), "items": items,
        "defaultMode": 0o440, "optional": True}}
    assert projection.mount("team-a", "tickets") == {
        "name": projection.volume_name("team-a", "tickets"),
        "mountPath": "/etc/agenttx/toolsets/team-a/tickets", "readOnly": True}


def _apply(dep: dict, ops: list | None) -> dict:
    return jsonpatch.apply_patch(dep, ops) if ops else dep


def test_volume_patch_mounts_updates_and_unmounts_one_toolset_only() -> None:
    dep = deployment()
    vname = projection.volume_name("team-a", "tickets")
    first = projection.items([SecretRef("t", "header")])
    vol, mnt = projection.volume("team-a", "tickets", first), projection.mount("team-a", "tickets")
    dep = _apply(dep, mounts.volume_patch(dep, TARGET, vname, vol, mnt))
    pod = dep["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}, vol]
    assert pod["containers"][1]["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, mnt]
    assert "volumeMounts" not in pod["containers"][0]
    assert projection.live_items(dep, "team-a", "tickets") == first
    # Idempotent: a second reconcile patches nothing.
    assert mounts.volume_patch(dep, TARGET, vname, vol, mnt) is None

    both = projection.merge_items(first, projection.items([SecretRef("t", "tenant")]))
    dep = _apply(dep, mounts.volume_patch(
        dep, TARGET, vname, projection.volume("team-a", "tickets", both), mnt))
    assert projection.live_items(dep, "team-a", "tickets") == both

    other = projection.volume_name("team-b", "mail")
    dep = _apply(dep, mounts.volume_patch(dep, TARGET, other,
                                          projection.volume("team-b", "mail", first),
                                          projection.mount("team-b", "mail")))
    dep = _apply(dep, mounts.volume_patch(dep, TARGET, vname, None, None))
    pod = dep["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp", other]
    assert [m["name"] for m in pod["containers"][1]["volumeMounts"]] == ["tmp", other]
    assert projection.live_items(dep, "team-a", "tickets") == []
    assert mounts.volume_patch(dep, TARGET, vname, None, None) is None


def test_rollout_complete_names_what_it_waits_for() -> None:
    dep = deployment()
    assert mounts.rollout_complete(dep, "the toolset's header files") == (True, "")
    dep["metadata"]["generation"] = 4
    assert mounts.rollout_complete(dep, "the toolset's header files") == (
        False, "the service Deployment has not observed the toolset's header files yet")
    dep["status"].update(observedGeneration=4, replicas=3, updatedReplicas=2)
    assert mounts.rollout_complete(dep, "the toolset's header files") == (
        False, "the service Deployment is rolling out the toolset's header files (1 old "
               "pod(s) without the toolset's header files still running)")


# ---- the status ----------------------------------------------------------------------

def test_status_published_is_ready_and_records_what_is_served() -> None:
    status = toolset_status.build_status(
        None, generation=2, reason=toolset_status.REASON_PUBLISHED, message="ok", now=NOW,
        published=(2, 3), header_secret="agenttx-system/toolset-x")
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Published")
    assert (status["observedGeneration"], status["publishedGeneration"], status["tools"],
            status["headerSecret"]) == (2, 2, 3, "agenttx-system/toolset-x")


@pytest.mark.parametrize("reason", [
    toolset_status.REASON_INVALID_SPEC, toolset_status.REASON_UPSTREAM_UNREACHABLE,
    toolset_status.REASON_UNKNOWN_TOOL, toolset_status.REASON_SECRET_NOT_FOUND,
    toolset_status.REASON_SECRET_INVALID, toolset_status.REASON_PROJECTION_PENDING,
    toolset_status.REASON_ETCD_UNAVAILABLE])
def test_status_other_reasons_keep_the_published_generation(reason: str) -> None:
    old = toolset_status.build_status(
        None, generation=1, reason=toolset_status.REASON_PUBLISHED, message="ok", now=NOW,
        published=(1, 3), header_secret="ns/copy")
    status = toolset_status.build_status(old, generation=2, reason=reason, message="why",
                                         now=LATER)
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("False", reason, 2)
    assert ready["lastTransitionTime"] == LATER
    assert (status["publishedGeneration"], status["tools"], status["headerSecret"]) == (
        1, 3, "ns/copy")
    assert toolset_status.published_note(status) == "; generation 1 stays published"


def test_status_before_anything_is_published_says_so() -> None:
    status = toolset_status.build_status(None, generation=1, reason="InvalidSpec", message="x",
                                         now=NOW)
    assert "publishedGeneration" not in status
    assert (status["tools"], status["headerSecret"]) == (0, "")
    assert toolset_status.published_note(status) == ""


def test_status_is_idempotent_and_moves_transition_time_only_on_flips() -> None:
    first = toolset_status.build_status(
        {"conditions": [{"type": "Other", "status": "True"}]}, generation=1,
        reason="UpstreamUnreachable", message="down", now=NOW)
    again = toolset_status.build_status(first, generation=1, reason="UpstreamUnreachable",
                                        message="down", now=LATER)
    assert again == first
    assert [c["type"] for c in again["conditions"]] == ["Other", "Ready"]
    other = toolset_status.build_status(first, generation=1, reason="UnknownTool",
                                        message="no x", now=LATER)
    assert other["conditions"][1]["lastTransitionTime"] == NOW  # still False


# ---- orphans -------------------------------------------------------------------------

def test_orphaned_toolset_keys_respect_namespaces_and_live_toolsets() -> None:
    keys = Keys("/agenttx")
    published = {keys.toolset("team-a", "live"): 1, keys.toolset("team-a", "gone"): 2,
                 keys.toolset("team-b", "gone"): 3, keys.policy("team-a", "gone"): 4,
                 keys.toolset("team-ab", "gone"): 5}
    existing = [("team-a", "live")]
    assert lifecycle.orphaned_toolset_keys(published, existing, keys) == {
        keys.toolset("team-a", "gone"): 2, keys.toolset("team-b", "gone"): 3,
        keys.toolset("team-ab", "gone"): 5}
    # An operator watching team-a only never touches team-b's (or team-ab's) keys.
    assert lifecycle.orphaned_toolset_keys(published, existing, keys, ["team-a"]) == {
        keys.toolset("team-a", "gone"): 2}
