"""Pure functions of the operator (`reconcile`, and `jwks` for the issuer keys): no
kopf, API server or etcd."""

from __future__ import annotations

import copy
import json

import jsonpatch
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from agenttx.contracts.layout import Keys
from agenttx.contracts.policy import parse_published_policy
from agenttx_operator import conditions, handlers, jwks, lifecycle, mounts, policy_spec, sandboxes
from agenttx_operator.config import OperatorConfig
from agenttx_operator.sandboxes import Target

TARGET = Target(service_namespace="agenttx-system", deployment="agenttx", container="agenttx")
NOW = "2030-01-01T00:00:00Z"
LATER = "2030-01-01T00:05:00Z"


def full_spec() -> dict:
    return {
        "priority": 10,
        "selector": {"agentIdPrefix": "billing-", "matchMetadata": {"team": "billing", "a": "b"}},
        "rollback": {"maxLocalDepth": 0, "maxGlobalResets": 2, "replayBudgetFactor": 4},
        "sandbox": {"size": "1Gi", "accessModes": ["ReadWriteOnce"], "reclaimPolicy": "Retain"},
        "idleTimeoutSeconds": 60,
    }


def service_deployment(**pod_extra: object) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "agenttx", "namespace": "agenttx-system", "generation": 3},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "x"},
                        {
                            "name": "agenttx",
                            "image": "agenttx:1",
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                        },
                    ],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    **pod_extra,
                }
            },
        },
        "status": {"observedGeneration": 3, "updatedReplicas": 2, "replicas": 2,
                   "availableReplicas": 2},
    }


# ---- validation --------------------------------------------------------------------

def test_full_spec_is_valid() -> None:
    assert policy_spec.validate_spec(full_spec()) == []
    assert policy_spec.validate_spec({}) == []


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        ({"rollback": {"maxLocalDepth": 17}}, "spec.rollback.maxLocalDepth"),
        ({"rollback": {"maxGlobalResets": -1}}, "spec.rollback.maxGlobalResets"),
        ({"rollback": {"maxLocalDepth": True}}, "spec.rollback.maxLocalDepth"),
        ({"rollback": {"replayBudgetFactor": 0.05}}, "spec.rollback.replayBudgetFactor"),
        ({"rollback": {"replayBudgetFactor": float("nan")}}, "spec.rollback.replayBudgetFactor"),
        ({"rollback": {"replayBudgetFactor": 1001}}, "spec.rollback.replayBudgetFactor"),
        ({"rollback": {"maxLocalDeph": 1}}, "spec.rollback.maxLocalDeph: unknown field"),
        ({"priority": "high"}, "spec.priority"),
        ({"selector": {"agentIdPrefix": "é" * 129}}, "at most 256 bytes"),
        ({"selector": {"matchMetadata": {"tier": 2}}}, "spec.selector.matchMetadata"),
        ({"selector": {"matchMetadata": {f"k{i}": "v" for i in range(65)}}}, "at most 64"),
        ({"sandbox": {"size": "lots"}}, "spec.sandbox.size"),
        ({"sandbox": {}}, "spec.sandbox.size"),
        ({"sandbox": {"size": "1Gi", "reclaimPolicy": "Recycle"}}, "reclaimPolicy"),
        ({"sandbox": {"size": "1Gi", "accessModes": ["ReadOnlyMany"]}}, "accessModes"),
        ({"sandbox": {"size": "1Gi", "accessModes": []}}, "accessModes"),
        ({"idleTimeoutSeconds": 0}, "spec.idleTimeoutSeconds"),
        ({"surprise": 1}, "spec.surprise: unknown field"),
    ],
)
def test_invalid_spec_names_the_field(patch: dict, fragment: str) -> None:
    errors = policy_spec.validate_spec(patch)
    assert any(fragment in e for e in errors), errors


def test_non_object_spec_is_invalid() -> None:
    assert policy_spec.validate_spec(None) == ["spec: must be an object"]


# ---- publish payload ---------------------------------------------------------------

def test_publish_payload_is_the_service_wire_format() -> None:
    policy = policy_spec.normalise("team-a", "billing", 7, full_spec())
    raw = policy_spec.publish_payload(policy)
    doc = json.loads(raw)
    assert doc == {
        "namespace": "team-a",
        "name": "billing",
        "generation": 7,
        "priority": 10,
        "selector": {"agent_id_prefix": "billing-", "match_metadata": {"a": "b", "team": "billing"}},
        "rollback": {"max_local_depth": 0, "max_global_resets": 2, "replay_budget_factor": 4.0},
        "idle_timeout_s": 60,
        "sandbox_path": "/sandboxes/team-a/billing",
    }
    assert parse_published_policy(raw) == policy


def test_publish_payload_leaves_unset_fields_to_the_layer_below() -> None:
    policy = policy_spec.normalise("ns", "p", 1, {"rollback": {"maxLocalDepth": 2}})
    doc = json.loads(policy_spec.publish_payload(policy))
    assert doc["rollback"] == {"max_local_depth": 2}
    assert doc["priority"] == 0
    assert doc["selector"] == {"agent_id_prefix": "", "match_metadata": {}}
    assert doc["idle_timeout_s"] is None and doc["sandbox_path"] is None


def test_publish_payload_is_byte_stable() -> None:
    a = policy_spec.publish_payload(policy_spec.normalise("ns", "p", 1, full_spec()))
    spec = full_spec()
    spec["selector"]["matchMetadata"] = dict(reversed(list(spec["selector"]["matchMetadata"].items())))
    b = policy_spec.publish_payload(policy_spec.normalise("ns", "p", 1, spec))
    assert a == b


def test_normalise_refuses_an_invalid_spec() -> None:
    with pytest.raises(ValueError, match="maxLocalDepth"):
        policy_spec.normalise("ns", "p", 1, {"rollback": {"maxLocalDepth": 17}})


def test_sandbox_path_uses_the_configured_mount_root() -> None:
    policy = policy_spec.normalise("ns", "p", 1, {"sandbox": {"size": "1Gi"}}, mount_root="/mnt/sb/")
    assert policy.sandbox_path == "/mnt/sb/ns/p"


def test_operator_keys_are_the_service_keys() -> None:
    """One key layout (agenttx.contracts.layout.Keys) for both processes, whichever way the
    prefix is written."""
    for prefix in ("agenttx", "/agenttx", "/agenttx/"):
        config = OperatorConfig(_cli_parse_args=[], etcd_endpoints=["e:2379"],
                                etcd_prefix=prefix)
        keys = handlers.operator_keys(config)
        assert keys.policies_prefix() == b"/agenttx/policies/"
        assert keys.policy("ns", "p") == b"/agenttx/policies/ns/p"
        assert keys.auth_jwks() == b"/agenttx/auth/jwks"
    for module in (conditions, lifecycle, mounts, policy_spec, sandboxes):
        assert not hasattr(module, "policy_key") and not hasattr(module, "policies_prefix")


# ---- names and the claim -----------------------------------------------------------

def test_names_are_dns_safe_unique_and_bounded() -> None:
    long = "x" * 253
    assert len(sandboxes.claim_name("ns", long)) <= 253
    assert len(sandboxes.volume_name("n" * 63, long)) <= 63
    assert sandboxes.volume_name("a-b", "c") != sandboxes.volume_name("a", "b-c")
    assert sandboxes.claim_name("a-b", "c") != sandboxes.claim_name("a", "b-c")
    name = sandboxes.volume_name("Team.A", "my.policy")
    assert name == name.lower() and "." not in name


def test_build_pvc_lives_in_the_service_namespace_and_records_reclaim_policy() -> None:
    pvc = sandboxes.build_pvc("team-a", "research", full_spec()["sandbox"], TARGET)
    assert pvc["metadata"]["namespace"] == "agenttx-system"
    assert pvc["metadata"]["name"] == sandboxes.claim_name("team-a", "research")
    assert pvc["metadata"]["annotations"] == {
        sandboxes.ANNOTATION_POLICY: "team-a/research",
        sandboxes.ANNOTATION_RECLAIM_POLICY: "Retain",
    }
    assert pvc["metadata"]["labels"][sandboxes.LABEL_MANAGED_BY] == "agenttx-operator"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    }
    assert "ownerReferences" not in pvc["metadata"]


def test_build_pvc_defaults_to_read_write_many_and_named_storage_class() -> None:
    pvc = sandboxes.build_pvc("ns", "p", {"size": "2Gi", "storageClassName": "nfs"}, TARGET)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == "nfs"
    assert pvc["metadata"]["annotations"][sandboxes.ANNOTATION_RECLAIM_POLICY] == "Delete"


def test_plan_claim_is_empty_for_the_claim_it_built() -> None:
    desired = sandboxes.build_pvc("ns", "p", {"size": "1Gi"}, TARGET)
    live = copy.deepcopy(desired)
    live["spec"]["volumeName"] = "pv-123"  # server-side additions do not count
    live["status"] = {"phase": "Bound"}
    assert sandboxes.plan_claim(live, desired) == sandboxes.ClaimPlan(None, None, ())


def test_plan_claim_grows_but_never_shrinks_or_moves() -> None:
    live = sandboxes.build_pvc("ns", "p", {"size": "1Gi"}, TARGET)
    bigger = sandboxes.build_pvc("ns", "p", {"size": "2048Mi", "reclaimPolicy": "Retain"}, TARGET)
    plan = sandboxes.plan_claim(live, bigger)
    # Two patches: the cluster may refuse the resize, never the annotation.
    assert plan.patch == {
        "metadata": {"annotations": {sandboxes.ANNOTATION_RECLAIM_POLICY: "Retain"}}}
    assert plan.resize == {"spec": {"resources": {"requests": {"storage": "2048Mi"}}}}
    assert plan.problems == ()
    same = sandboxes.build_pvc("ns", "p", {"size": "1024Mi"}, TARGET)
    assert sandboxes.plan_claim(live, same) == sandboxes.ClaimPlan(None, None, ())
    smaller = sandboxes.build_pvc(
        "ns", "p", {"size": "500Mi", "storageClassName": "fast",
                    "accessModes": ["ReadWriteOnce"]}, TARGET)
    plan = sandboxes.plan_claim(live, smaller)
    assert plan.patch is None and plan.resize is None
    assert [p.split(" ", 1)[0] for p in plan.problems] == [
        "sandbox.size", "sandbox.storageClassName", "sandbox.accessModes"]


def test_claim_sync_reports_a_refused_resize_with_the_api_message() -> None:
    live = sandboxes.build_pvc("ns", "p", {"size": "1Gi"}, TARGET)
    bigger = sandboxes.build_pvc("ns", "p", {"size": "5Gi"}, TARGET)
    sync = sandboxes.claim_sync(live, bigger, refused=(403, "only dynamically provisioned "
                                                            "pvc can be resized"))
    claim = sandboxes.claim_name("ns", "p")
    assert sync == conditions.ClaimSync(False, "ResizeRefused", (
        f"the cluster refused to resize claim agenttx-system/{claim} from 1Gi to 5Gi "
        "(HTTP 403: only dynamically provisioned pvc can be resized); the sandbox keeps 1Gi"))
    drift = sandboxes.claim_sync(live, bigger, problems=["sandbox.accessModes differ"])
    assert (drift.synced, drift.reason, drift.message) == (
        False, "ClaimDrift", "sandbox.accessModes differ")
    assert sandboxes.claim_sync(live, live) == conditions.ClaimSync(
        True, "InSync", f"claim agenttx-system/{claim} matches spec.sandbox")


def test_quantities_compare_in_bytes() -> None:
    assert sandboxes.quantity_bytes("1Gi") == sandboxes.quantity_bytes("1024Mi")
    assert sandboxes.quantity_bytes("1G") == 1e9
    assert sandboxes.quantity_bytes("1e3") == 1000


def test_claim_retained_reads_the_annotation() -> None:
    retained = sandboxes.build_pvc("ns", "p", {"size": "1Gi", "reclaimPolicy": "Retain"}, TARGET)
    deleted = sandboxes.build_pvc("ns", "p", {"size": "1Gi"}, TARGET)
    assert sandboxes.claim_retained(retained) is True
    assert sandboxes.claim_retained(deleted) is False
    assert sandboxes.claim_retained(None) is False


# ---- the Deployment patch ----------------------------------------------------------

def test_mount_patch_adds_exactly_one_volume_and_mount() -> None:
    dep = service_deployment()
    ops = mounts.deployment_patch(dep, "team-a", "research", TARGET, mounted=True)
    assert ops is not None
    after = jsonpatch.apply_patch(dep, ops)
    pod = after["spec"]["template"]["spec"]
    vname = sandboxes.volume_name("team-a", "research")
    assert pod["volumes"] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": vname,
         "persistentVolumeClaim": {"claimName": sandboxes.claim_name("team-a", "research")}},
    ]
    assert pod["containers"][1]["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": vname, "mountPath": "/sandboxes/team-a/research"},
    ]
    assert pod["containers"][0] == {"name": "sidecar", "image": "x"}  # untouched
    assert ops[0] == {"op": "test", "path": "/spec/template/spec/containers/1/name",
                      "value": "agenttx"}


def test_mount_patch_is_idempotent() -> None:
    dep = service_deployment()
    after = jsonpatch.apply_patch(
        dep, mounts.deployment_patch(dep, "ns", "p", TARGET, mounted=True))
    assert mounts.deployment_patch(after, "ns", "p", TARGET, mounted=True) is None


def test_api_server_defaults_do_not_count_as_drift() -> None:
    dep = service_deployment()
    after = jsonpatch.apply_patch(
        dep, mounts.deployment_patch(dep, "ns", "p", TARGET, mounted=True))
    after["spec"]["template"]["spec"]["containers"][1]["volumeMounts"][1]["readOnly"] = False
    assert mounts.deployment_patch(after, "ns", "p", TARGET, mounted=True) is None


def test_mount_patch_creates_missing_lists() -> None:
    dep = service_deployment()
    del dep["spec"]["template"]["spec"]["volumes"]
    del dep["spec"]["template"]["spec"]["containers"][1]["volumeMounts"]
    after = jsonpatch.apply_patch(
        dep, mounts.deployment_patch(dep, "ns", "p", TARGET, mounted=True))
    pod = after["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == [sandboxes.volume_name("ns", "p")]
    assert [m["mountPath"] for m in pod["containers"][1]["volumeMounts"]] == ["/sandboxes/ns/p"]


def test_unmount_removes_only_this_policy_and_is_idempotent() -> None:
    dep = service_deployment()
    for ns, name in (("ns", "a"), ("ns", "b")):
        dep = jsonpatch.apply_patch(
            dep, mounts.deployment_patch(dep, ns, name, TARGET, mounted=True))
    ops = mounts.deployment_patch(dep, "ns", "a", TARGET, mounted=False)
    assert ops is not None
    assert all(op["op"] in ("test", "remove") for op in ops)
    after = jsonpatch.apply_patch(dep, ops)
    pod = after["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp", sandboxes.volume_name("ns", "b")]
    assert [m["mountPath"] for m in pod["containers"][1]["volumeMounts"]] == [
        "/tmp", "/sandboxes/ns/b"]
    assert mounts.deployment_patch(after, "ns", "a", TARGET, mounted=False) is None
    assert mounts.deployment_patch(service_deployment(), "ns", "a", TARGET,
                                      mounted=False) is None


def test_patch_guards_indexes_against_concurrent_changes() -> None:
    dep = service_deployment()
    dep = jsonpatch.apply_patch(dep, mounts.deployment_patch(dep, "ns", "a", TARGET,
                                                                mounted=True))
    ops = mounts.deployment_patch(dep, "ns", "a", TARGET, mounted=False)
    # Someone inserts a volume at the front after we read the Deployment.
    moved = copy.deepcopy(dep)
    moved["spec"]["template"]["spec"]["volumes"].insert(0, {"name": "new", "emptyDir": {}})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(moved, ops)


def test_patch_repairs_a_mount_at_the_wrong_path() -> None:
    dep = service_deployment()
    dep = jsonpatch.apply_patch(dep, mounts.deployment_patch(dep, "ns", "a", TARGET,
                                                                mounted=True))
    dep["spec"]["template"]["spec"]["containers"][1]["volumeMounts"][1]["mountPath"] = "/x"
    ops = mounts.deployment_patch(dep, "ns", "a", TARGET, mounted=True)
    assert [op["op"] for op in ops] == ["test", "test", "replace"]
    after = jsonpatch.apply_patch(dep, ops)
    assert after["spec"]["template"]["spec"]["containers"][1]["volumeMounts"][1][
        "mountPath"] == "/sandboxes/ns/a"


def test_mount_patch_needs_the_service_container() -> None:
    other = Target(service_namespace="s", container="missing")
    with pytest.raises(mounts.ContainerNotFound, match="missing"):
        mounts.deployment_patch(service_deployment(), "ns", "p", other, mounted=True)
    assert mounts.deployment_patch(service_deployment(), "ns", "p", other,
                                      mounted=False) is None


# ---- volume readiness --------------------------------------------------------------

def test_volume_ready_needs_bound_claim_and_rolled_out_deployment() -> None:
    pvc = sandboxes.build_pvc("ns", "p", {"size": "1Gi"}, TARGET)
    dep = service_deployment()
    assert mounts.volume_ready(None, dep)[0] is False
    ready, why = mounts.volume_ready(pvc, dep)
    assert not ready and "Pending" in why
    pvc["status"] = {"phase": "Bound"}
    assert mounts.volume_ready(pvc, dep) == (True, "")
    dep["metadata"]["generation"] = 4
    ready, why = mounts.volume_ready(pvc, dep)
    assert not ready and "not observed" in why
    dep["status"] = {"observedGeneration": 4, "updatedReplicas": 1}
    ready, why = mounts.volume_ready(pvc, dep)
    assert not ready and "1/2" in why
    assert mounts.volume_ready(pvc, None)[0] is False


BOUND = {**sandboxes.build_pvc("ns", "p", {"size": "1Gi"}, TARGET), "status": {"phase": "Bound"}}


@pytest.mark.parametrize(("status", "why"), [
    # The issue's case: both new pods are up, but an old pod (without the mount) still
    # serves during the surge.
    ({"replicas": 3, "updatedReplicas": 2, "availableReplicas": 2},
     "1 old pod(s) without the sandbox mount still running"),
    ({"replicas": 2, "updatedReplicas": 2, "availableReplicas": 1},
     "1/2 updated pods available"),
    ({"replicas": 2, "updatedReplicas": 2},
     "0/2 updated pods available"),
    ({"replicas": 3, "updatedReplicas": 1, "availableReplicas": 3},
     "1/2 pods updated"),
    ({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2},
     "has not observed the sandbox mount yet"),
])
def test_volume_ready_waits_for_the_rollout_to_complete(status: dict, why: str) -> None:
    dep = service_deployment()
    dep["status"] = {"observedGeneration": 3, **status}
    ready, message = mounts.volume_ready(BOUND, dep)
    assert not ready
    assert why in message


def test_volume_ready_reports_a_stuck_rollout() -> None:
    dep = service_deployment()
    dep["status"] = {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1,
                     "availableReplicas": 2, "conditions": [{
                         "type": "Progressing", "status": "False",
                         "reason": "ProgressDeadlineExceeded",
                         "message": 'ReplicaSet "agenttx-7d9" has timed out progressing.'}]}
    ready, why = mounts.volume_ready(BOUND, dep)
    assert not ready
    assert why == (
        "the service Deployment is rolling out the sandbox mount (1/2 pods updated); "
        "its rollout exceeded the progress deadline: "
        'ReplicaSet "agenttx-7d9" has timed out progressing.')


def test_volume_ready_once_every_pod_runs_the_mount() -> None:
    dep = service_deployment()
    assert mounts.volume_ready(BOUND, dep) == (True, "")
    dep["spec"]["replicas"] = 0  # scaled to zero: no pod can serve without the mount
    dep["status"] = {"observedGeneration": 3}
    assert mounts.volume_ready(BOUND, dep) == (True, "")


# ---- status ------------------------------------------------------------------------

def test_status_published_is_ready_true() -> None:
    status = conditions.build_status(None, generation=2, reason=conditions.REASON_PUBLISHED,
                                    message="ok", sandbox_claim="s/c", now=NOW)
    assert status == {
        "observedGeneration": 2,
        "sandboxClaim": "s/c",
        "conditions": [{
            "type": "Ready", "status": "True", "observedGeneration": 2,
            "lastTransitionTime": NOW, "reason": "Published", "message": "ok",
        }],
    }


@pytest.mark.parametrize("reason", [conditions.REASON_INVALID_SPEC,
                                    conditions.REASON_ETCD_UNAVAILABLE,
                                    conditions.REASON_VOLUME_PENDING])
def test_status_other_reasons_are_ready_false(reason: str) -> None:
    status = conditions.build_status(None, generation=1, reason=reason, message="m",
                                    sandbox_claim=None, now=NOW)
    assert status["conditions"][0]["status"] == "False"
    assert status["conditions"][0]["reason"] == reason
    assert status["sandboxClaim"] == ""


def test_status_transition_time_moves_only_when_status_flips() -> None:
    first = conditions.build_status(None, generation=1, reason=conditions.REASON_VOLUME_PENDING,
                                   message="binding", sandbox_claim="s/c", now=NOW)
    # Same status (False), other reason: the transition time stays.
    second = conditions.build_status(first, generation=1,
                                    reason=conditions.REASON_ETCD_UNAVAILABLE,
                                    message="down", sandbox_claim="s/c", now=LATER)
    assert second["conditions"][0]["lastTransitionTime"] == NOW
    third = conditions.build_status(second, generation=1, reason=conditions.REASON_PUBLISHED,
                                   message="ok", sandbox_claim="s/c", now=LATER)
    assert third["conditions"][0]["lastTransitionTime"] == LATER


def test_status_is_idempotent_and_keeps_other_conditions() -> None:
    old = {"conditions": [{"type": "Custom", "status": "True", "reason": "X", "message": "",
                           "lastTransitionTime": NOW}]}
    first = conditions.build_status(old, generation=3, reason=conditions.REASON_PUBLISHED,
                                   message="ok", sandbox_claim=None, now=NOW)
    assert [c["type"] for c in first["conditions"]] == ["Custom", "Ready"]
    again = conditions.build_status(first, generation=3, reason=conditions.REASON_PUBLISHED,
                                   message="ok", sandbox_claim=None, now=LATER)
    assert again == first
    assert conditions.status_patch(first, again) is None
    changed = conditions.build_status(first, generation=4, reason=conditions.REASON_PUBLISHED,
                                     message="ok", sandbox_claim=None, now=LATER)
    assert set(conditions.status_patch(first, changed)) == {"observedGeneration", "conditions"}


def test_status_claim_condition_is_set_kept_and_removed() -> None:
    refused = conditions.ClaimSync(False, "ResizeRefused", "refused")
    first = conditions.build_status(None, generation=2, reason=conditions.REASON_PUBLISHED,
                                   message="ok", sandbox_claim="s/c", now=NOW,
                                   claim_sync=refused)
    assert first["conditions"] == [
        {"type": "SandboxClaimSynced", "status": "False", "observedGeneration": 2,
         "lastTransitionTime": NOW, "reason": "ResizeRefused", "message": "refused"},
        {"type": "Ready", "status": "True", "observedGeneration": 2,
         "lastTransitionTime": NOW, "reason": "Published", "message": "ok"},
    ]
    # KEEP (an invalid spec, a deletion): the claim condition stays exactly as it was.
    kept = conditions.build_status(first, generation=3, reason=conditions.REASON_INVALID_SPEC,
                                  message="bad", sandbox_claim="s/c", now=LATER)
    assert kept["conditions"][0] == first["conditions"][0]
    # Same False status again: the transition time stays; flipping to True moves it.
    again = conditions.build_status(first, generation=3, reason=conditions.REASON_PUBLISHED,
                                   message="ok", sandbox_claim="s/c", now=LATER,
                                   claim_sync=refused)
    assert again["conditions"][0]["lastTransitionTime"] == NOW
    fixed = conditions.build_status(again, generation=4, reason=conditions.REASON_PUBLISHED,
                                   message="ok", sandbox_claim="s/c", now=LATER,
                                   claim_sync=conditions.ClaimSync(True, "InSync", "fine"))
    assert fixed["conditions"][0]["status"] == "True"
    assert fixed["conditions"][0]["lastTransitionTime"] == LATER
    # No sandbox any more: the condition goes.
    gone = conditions.build_status(fixed, generation=5, reason=conditions.REASON_PUBLISHED,
                                  message="ok", sandbox_claim=None, now=LATER, claim_sync=None)
    assert [c["type"] for c in gone["conditions"]] == ["Ready"]


# ---- deletion ----------------------------------------------------------------------

def test_delete_removes_claim_unless_retained() -> None:
    assert lifecycle.delete_actions({"sandbox": {"size": "1Gi"}}) == lifecycle.DeleteActions(
        unpublish=True, unmount=True, delete_claim=True)
    assert lifecycle.delete_actions(
        {"sandbox": {"size": "1Gi", "reclaimPolicy": "Retain"}}
    ) == lifecycle.DeleteActions(unpublish=True, unmount=True, delete_claim=False)
    assert lifecycle.delete_actions({}).delete_claim is True


def test_delete_tolerates_an_invalid_spec() -> None:
    assert lifecycle.delete_actions(None).unpublish is True
    assert lifecycle.delete_actions({"sandbox": "junk"}).delete_claim is True


def test_orphaned_keys_respects_prefix_namespaces_and_live_policies() -> None:
    published = {
        b"/agenttx/policies/a/live": 5,
        b"/agenttx/policies/a/gone": 6,
        b"/agenttx/policies/b/gone": 7,
        b"/other/policies/a/gone": 8,
    }
    existing = {("a", "live")}
    for keys in (Keys("/agenttx"), Keys("agenttx")):
        assert lifecycle.orphaned_keys(published, existing, keys) == {
            b"/agenttx/policies/a/gone": 6, b"/agenttx/policies/b/gone": 7}
        assert lifecycle.orphaned_keys(published, existing, keys, ["a"]) == {
            b"/agenttx/policies/a/gone": 6}


def test_retry_delay_doubles_up_to_the_cap() -> None:
    assert [lifecycle.retry_delay(r, 2, 60) for r in range(7)] == [2, 4, 8, 16, 32, 60, 60]
    assert lifecycle.retry_delay(10_000, 2, 60) == 60


# ---- service-account issuer keys (jwks) ---------------------------------------------

ISSUER = "https://kubernetes.default.svc.cluster.local"
DISCOVERY = {
    "issuer": ISSUER,
    "jwks_uri": "https://172.18.0.2:6443/openid/v1/jwks",
    "response_types_supported": ["id_token"],
    "subject_types_supported": ["public"],
    "id_token_signing_alg_values_supported": ["RS256"],
}


def public_jwk(kid: str) -> dict:
    """An RSA public key as the API server serves it in /openid/v1/jwks."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {**jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True),
            "kid": kid, "use": "sig", "alg": "RS256"}


@pytest.fixture(scope="module")
def k1() -> dict:
    return public_jwk("k1")


def test_discovery_gives_issuer_and_jwks_uri() -> None:
    d = jwks.parse_discovery(DISCOVERY)
    assert d == jwks.Discovery(issuer=ISSUER, jwks_uri=DISCOVERY["jwks_uri"])
    assert d.jwks_uri_path == jwks.JWKS_PATH


@pytest.mark.parametrize(("doc", "message"), [
    ([DISCOVERY], "the discovery document is not a JSON object"),
    ({**DISCOVERY, "issuer": ""}, 'the discovery document has no issuer: ""'),
    ({"jwks_uri": "https://x/openid/v1/jwks"}, "the discovery document has no issuer: null"),
    ({**DISCOVERY, "jwks_uri": 7}, "the discovery document has no jwks_uri: 7"),
])
def test_discovery_without_issuer_or_jwks_uri_is_refused(doc: object, message: str) -> None:
    with pytest.raises(jwks.JwksError) as err:
        jwks.parse_discovery(doc)
    assert str(err.value).startswith(message)


def test_document_is_issuer_and_the_public_keys(k1: dict) -> None:
    doc = jwks.build_document(jwks.parse_discovery(DISCOVERY), {"keys": [k1], "extra": 1})
    assert doc == {"issuer": ISSUER, "jwks": {"keys": [k1]}}
    assert jwks.describe(doc) == f"issuer {ISSUER}, 1 key(s): k1"
    # What the service will do with it: PyJWT loads the published key set.
    assert [k.key_id for k in jwt.PyJWKSet.from_dict(doc["jwks"])] == ["k1"]


def test_document_is_byte_stable(k1: dict) -> None:
    d = jwks.parse_discovery(DISCOVERY)
    shuffled = dict(reversed(list(k1.items())))
    first = jwks.encode(jwks.build_document(d, {"keys": [k1]}))
    assert first == jwks.encode(jwks.build_document(d, {"keys": [shuffled]}))
    assert json.loads(first) == {"issuer": ISSUER, "jwks": {"keys": [k1]}}
    assert first.startswith(b'{"issuer":"https://kubernetes.default.svc.cluster.local",')


@pytest.mark.parametrize(("keyset", "message"), [
    ([], "the key set is not a JSON object: []"),
    ({}, "the key set has no keys: null"),
    ({"keys": []}, "the key set has no keys: []"),
    ({"keys": "k1"}, 'the key set has no keys: "k1"'),
    ({"keys": ["k1"]}, 'key 0 is not a JWK (an object with a kty): "k1"'),
    ({"keys": [{"kid": "k1"}]}, 'key 0 is not a JWK (an object with a kty): {"kid": "k1"}'),
    ({"keys": [{"kty": "RSA", "kid": "junk", "n": "AQAB", "e": "%%"}]},
     "the key set has no key usable for verification"),
    ({"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]},
     "key 0 (s) carries private members k; only public keys are published"),
])
def test_garbage_key_sets_are_refused(keyset: object, message: str) -> None:
    with pytest.raises(jwks.JwksError) as err:
        jwks.build_document(jwks.parse_discovery(DISCOVERY), keyset)
    assert str(err.value).startswith(message)


def test_a_private_key_is_never_published(k1: dict) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = {**jwt.algorithms.RSAAlgorithm.to_jwk(key, as_dict=True), "kid": "oops"}
    with pytest.raises(jwks.JwksError, match=r"key 1 \(oops\) carries private members "
                                             r"d, dp, dq, p, q, qi"):
        jwks.build_document(jwks.parse_discovery(DISCOVERY), {"keys": [k1, private]})
