"""What the operator should do about one AgentTxPolicy, as pure functions over plain dicts.

Why a module of its own: every decision the operator makes (is the spec valid, what goes
into etcd, what the sandbox claim looks like, which JSON patch mounts it, what the status
says, what a deletion removes) is computed here from the objects as the API server
returned them, so it is unit-tested without kopf, an API server or etcd. The kopf
handlers only fetch, call these functions, and send what they return.

What it must never do: perform I/O, read the clock (callers pass `now`), or mutate its
arguments. Every builder is idempotent: feeding its own output back in yields "nothing
to do" (None), which is how a second reconcile of an unchanged policy changes nothing.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agenttx.contracts.layout import Keys
from agenttx.contracts.policy import PublishedPolicy, policy_to_json

GROUP = "agenttx.io"
VERSION = "v1alpha1"
PLURAL = "agenttxpolicies"
KIND = "AgentTxPolicy"

CONDITION_READY = "Ready"
REASON_PUBLISHED = "Published"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_ETCD_UNAVAILABLE = "EtcdUnavailable"
REASON_VOLUME_PENDING = "VolumePending"

# Whether the sandbox claim is what spec.sandbox asks for (only on policies with one).
# False never holds up publishing: the sandbox works at the claim's current size.
CONDITION_CLAIM_SYNCED = "SandboxClaimSynced"
REASON_IN_SYNC = "InSync"
REASON_RESIZE_REFUSED = "ResizeRefused"
REASON_CLAIM_DRIFT = "ClaimDrift"
# How a real API server refuses a claim resize: 403 from the PersistentVolumeClaimResize
# admission plugin (a static PV, a StorageClass without allowVolumeExpansion), 422 from
# PVC validation (e.g. a claim that is not bound). Neither passes by retrying.
RESIZE_REFUSED_STATUSES = frozenset({403, 422})

# Labels/annotations on the objects the operator creates in the service namespace.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "agenttx-operator"
LABEL_COMPONENT = "app.kubernetes.io/component"
# Label values are at most 63 characters, policy names up to 253: the label carries a
# hash, the annotations carry the readable identity.
LABEL_POLICY_HASH = "agenttx.io/policy-hash"
ANNOTATION_POLICY = "agenttx.io/policy"
ANNOTATION_RECLAIM_POLICY = "agenttx.io/reclaim-policy"

DEFAULT_MOUNT_ROOT = "/sandboxes"

# The gRPC API's ranges (SPEC §1); the CRD schema enforces the same, this is the
# operator's own check for objects that reach it without that schema (an old CRD, a
# byte-length the schema cannot express).
DEPTH_MIN, DEPTH_MAX = 0, 16
FACTOR_MIN, FACTOR_MAX = 0.1, 1000.0
AGENT_ID_PREFIX_MAX_BYTES = 256
MATCH_METADATA_MAX = 64
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
DEFAULT_ACCESS_MODES = ("ReadWriteMany",)
RECLAIM_POLICIES = ("Delete", "Retain")

# apimachinery's resource.Quantity grammar, as controller-gen renders it into CRDs.
QUANTITY_RE = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

_SPEC_FIELDS = {"priority", "selector", "rollback", "sandbox", "idleTimeoutSeconds"}
_SELECTOR_FIELDS = {"agentIdPrefix", "matchMetadata"}
_ROLLBACK_FIELDS = {"maxLocalDepth", "maxGlobalResets", "replayBudgetFactor"}
_SANDBOX_FIELDS = {"size", "storageClassName", "accessModes", "reclaimPolicy"}


@dataclass(frozen=True)
class Target:
    """Where sandboxes go: the service's namespace, Deployment and container."""

    service_namespace: str
    deployment: str = "agenttx"
    container: str = "agenttx"
    mount_root: str = DEFAULT_MOUNT_ROOT


# ---- validation and normalisation --------------------------------------------------

def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unknown(where: str, obj: Mapping[str, Any], known: set[str]) -> list[str]:
    return [f"{where}.{k}: unknown field" for k in sorted(set(obj) - known)]


def validate_spec(spec: Any) -> list[str]:
    """Every problem with `spec`, each as "<field path>: <what is wrong>"; [] when valid.

    Mirrors the CRD schema (same ranges as the gRPC API) plus what a schema cannot say
    (agentIdPrefix is limited in UTF-8 bytes, like agent_id).
    """
    if not isinstance(spec, Mapping):
        return ["spec: must be an object"]
    errors = _unknown("spec", spec, _SPEC_FIELDS)

    priority = spec.get("priority", 0)
    if not _is_int(priority) or not INT32_MIN <= priority <= INT32_MAX:
        errors.append(f"spec.priority: must be a 32-bit integer, got {priority!r}")

    selector = spec.get("selector", {})
    if not isinstance(selector, Mapping):
        errors.append("spec.selector: must be an object")
    else:
        errors += _unknown("spec.selector", selector, _SELECTOR_FIELDS)
        prefix = selector.get("agentIdPrefix", "")
        if not isinstance(prefix, str):
            errors.append(f"spec.selector.agentIdPrefix: must be a string, got {prefix!r}")
        elif len(prefix.encode("utf-8")) > AGENT_ID_PREFIX_MAX_BYTES:
            errors.append(
                f"spec.selector.agentIdPrefix: at most {AGENT_ID_PREFIX_MAX_BYTES} bytes "
                f"(agent_id's limit), got {len(prefix.encode('utf-8'))}"
            )
        meta = selector.get("matchMetadata", {})
        if not isinstance(meta, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            errors.append("spec.selector.matchMetadata: must map strings to strings")
        elif len(meta) > MATCH_METADATA_MAX:
            errors.append(
                f"spec.selector.matchMetadata: at most {MATCH_METADATA_MAX} entries, "
                f"got {len(meta)}"
            )

    rollback = spec.get("rollback", {})
    if not isinstance(rollback, Mapping):
        errors.append("spec.rollback: must be an object")
    else:
        errors += _unknown("spec.rollback", rollback, _ROLLBACK_FIELDS)
        for name in ("maxLocalDepth", "maxGlobalResets"):
            if name in rollback:
                v = rollback[name]
                if not _is_int(v) or not DEPTH_MIN <= v <= DEPTH_MAX:
                    errors.append(
                        f"spec.rollback.{name}: must be an integer between {DEPTH_MIN} and "
                        f"{DEPTH_MAX}, got {v!r}"
                    )
        if "replayBudgetFactor" in rollback:
            v = rollback["replayBudgetFactor"]
            ok = (
                (_is_int(v) or isinstance(v, float))
                and math.isfinite(float(v))
                and FACTOR_MIN <= float(v) <= FACTOR_MAX
            )
            if not ok:
                errors.append(
                    f"spec.rollback.replayBudgetFactor: must be a number between "
                    f"{FACTOR_MIN:g} and {FACTOR_MAX:g}, got {v!r}"
                )

    if "sandbox" in spec:
        errors += _validate_sandbox(spec["sandbox"])

    if "idleTimeoutSeconds" in spec:
        v = spec["idleTimeoutSeconds"]
        if not _is_int(v) or not 1 <= v <= INT32_MAX:
            errors.append(f"spec.idleTimeoutSeconds: must be an integer >= 1, got {v!r}")
    return errors


def _validate_sandbox(sandbox: Any) -> list[str]:
    if not isinstance(sandbox, Mapping):
        return ["spec.sandbox: must be an object"]
    errors = _unknown("spec.sandbox", sandbox, _SANDBOX_FIELDS)
    size = sandbox.get("size")
    if not isinstance(size, str) or not QUANTITY_RE.match(size):
        errors.append(f"spec.sandbox.size: must be a quantity such as 1Gi, got {size!r}")
    sc = sandbox.get("storageClassName")
    if sc is not None and not isinstance(sc, str):
        errors.append(f"spec.sandbox.storageClassName: must be a string, got {sc!r}")
    modes = sandbox.get("accessModes", list(DEFAULT_ACCESS_MODES))
    if (
        not isinstance(modes, list)
        or not modes
        or not all(isinstance(m, str) and m in ACCESS_MODES for m in modes)
    ):
        errors.append(
            f"spec.sandbox.accessModes: a non-empty list of {', '.join(ACCESS_MODES)}, "
            f"got {modes!r}"
        )
    reclaim = sandbox.get("reclaimPolicy", "Delete")
    if reclaim not in RECLAIM_POLICIES:
        errors.append(f"spec.sandbox.reclaimPolicy: must be Delete or Retain, got {reclaim!r}")
    return errors


def sandbox_path(namespace: str, name: str, mount_root: str = DEFAULT_MOUNT_ROOT) -> str:
    """The directory a policy's sandbox is mounted at in every service pod."""
    return f"{mount_root.rstrip('/')}/{namespace}/{name}"


def normalise(
    namespace: str,
    name: str,
    generation: int,
    spec: Mapping[str, Any],
    *,
    mount_root: str = DEFAULT_MOUNT_ROOT,
) -> PublishedPolicy:
    """The policy as published to etcd. Raises ValueError when `spec` is invalid."""
    errors = validate_spec(spec)
    if errors:
        raise ValueError("; ".join(errors))
    selector = spec.get("selector", {})
    rollback = spec.get("rollback", {})
    factor = rollback.get("replayBudgetFactor")
    return PublishedPolicy(
        namespace=namespace,
        name=name,
        generation=int(generation),
        priority=spec.get("priority", 0),
        agent_id_prefix=selector.get("agentIdPrefix", ""),
        match_metadata=dict(selector.get("matchMetadata", {})),
        max_local_depth=rollback.get("maxLocalDepth"),
        max_global_resets=rollback.get("maxGlobalResets"),
        replay_budget_factor=None if factor is None else float(factor),
        idle_timeout_s=spec.get("idleTimeoutSeconds"),
        sandbox_path=sandbox_path(namespace, name, mount_root) if "sandbox" in spec else None,
    )


def publish_payload(policy: PublishedPolicy) -> bytes:
    """The bytes stored under `Keys.policy`: the service's wire format, byte-stable."""
    return policy_to_json(policy)


# ---- names -------------------------------------------------------------------------

def _policy_hash(namespace: str, name: str) -> str:
    return hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()


def _dns_name(prefix: str, namespace: str, name: str, max_len: int) -> str:
    """`<prefix>-<ns>-<name>-<hash8>`, DNS-1123 safe and at most `max_len` characters.

    The hash keeps names unique where the readable part is ambiguous ("a-b"/"c" vs
    "a"/"b-c") or truncated.
    """
    digest = _policy_hash(namespace, name)[:8]
    readable = re.sub(r"[^a-z0-9-]", "-", f"{prefix}-{namespace}-{name}".lower())
    readable = readable[: max_len - len(digest) - 1].strip("-")
    return f"{readable}-{digest}"


def claim_name(namespace: str, name: str) -> str:
    """The sandbox PVC's name in the service namespace (a DNS subdomain, <= 253)."""
    return _dns_name("sandbox", namespace, name, 253)


def volume_name(namespace: str, name: str) -> str:
    """The pod volume's name (a DNS-1123 label, <= 63)."""
    return _dns_name("sbx", namespace, name, 63)


# ---- the sandbox claim -------------------------------------------------------------

def build_pvc(
    namespace: str, name: str, sandbox: Mapping[str, Any], target: Target
) -> dict[str, Any]:
    """The PersistentVolumeClaim for a policy's sandbox, in the service namespace.

    No ownerReference: the policy lives in another namespace, and cross-namespace owners
    are not allowed, so the finalizer removes the claim (SPEC §8).
    """
    spec: dict[str, Any] = {
        "accessModes": list(sandbox.get("accessModes", DEFAULT_ACCESS_MODES)),
        "resources": {"requests": {"storage": sandbox["size"]}},
    }
    if sandbox.get("storageClassName"):
        spec["storageClassName"] = sandbox["storageClassName"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(namespace, name),
            "namespace": target.service_namespace,
            "labels": {
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_COMPONENT: "sandbox",
                LABEL_POLICY_HASH: _policy_hash(namespace, name)[:16],
            },
            "annotations": {
                ANNOTATION_POLICY: f"{namespace}/{name}",
                ANNOTATION_RECLAIM_POLICY: sandbox.get("reclaimPolicy", "Delete"),
            },
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class ClaimPlan:
    """How to bring an existing claim in line: a merge patch of its metadata (None:
    nothing), a separate merge patch that grows it (None: nothing; the cluster may
    refuse it, which must not cost the metadata change), and the requested changes that
    a claim cannot take (reported, never forced)."""

    patch: dict[str, Any] | None
    resize: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "P": 1e15, "E": 1e18}


def quantity_bytes(q: str) -> float:
    """A Kubernetes quantity in bytes (enough precision to compare sizes)."""
    m = re.match(r"^([+-]?[0-9.]+)([eE][+-]?[0-9.]+|[KMGTPE]i|[numkMGTPE]?)$", q)
    if not m:
        raise ValueError(f"not a quantity: {q!r}")
    number, suffix = m.group(1), m.group(2)
    if suffix.lower().startswith("e") and len(suffix) > 1:
        return float(number + suffix)
    return float(number) * (_BINARY.get(suffix) or _DECIMAL[suffix])


def plan_claim(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> ClaimPlan:
    """Compare a live claim with `build_pvc`'s output.

    Only what Kubernetes lets change is patched: the reclaim annotation, and the size
    when it grows (volume expansion). Shrinking, another StorageClass or other access
    modes would need a new volume, so they are reported and left alone.
    """
    patch: dict[str, Any] = {}
    resize: dict[str, Any] | None = None
    problems: list[str] = []
    want_anno = desired["metadata"]["annotations"]
    have_anno = existing.get("metadata", {}).get("annotations") or {}
    anno = {k: v for k, v in want_anno.items() if have_anno.get(k) != v}
    if anno:
        patch["metadata"] = {"annotations": anno}

    have_spec = existing.get("spec", {})
    want_spec = desired["spec"]
    have_size = have_spec.get("resources", {}).get("requests", {}).get("storage")
    want_size = want_spec["resources"]["requests"]["storage"]
    if have_size != want_size:
        try:
            grow = have_size is None or quantity_bytes(want_size) > quantity_bytes(have_size)
            same = have_size is not None and quantity_bytes(want_size) == quantity_bytes(have_size)
        except ValueError:
            grow, same = False, False
        if grow:
            resize = {"spec": {"resources": {"requests": {"storage": want_size}}}}
        elif not same:
            problems.append(
                f"sandbox.size {want_size} is smaller than the claim's {have_size}; "
                "a claim cannot shrink"
            )
    if "storageClassName" in want_spec and have_spec.get("storageClassName") != want_spec[
        "storageClassName"
    ]:
        problems.append(
            f"sandbox.storageClassName {want_spec['storageClassName']!r} differs from the "
            f"claim's {have_spec.get('storageClassName')!r}; it cannot change in place"
        )
    if sorted(have_spec.get("accessModes") or []) != sorted(want_spec["accessModes"]):
        problems.append(
            f"sandbox.accessModes {want_spec['accessModes']} differ from the claim's "
            f"{have_spec.get('accessModes')}; they cannot change in place"
        )
    return ClaimPlan(patch or None, resize, tuple(problems))


def claim_size(pvc: Mapping[str, Any]) -> str:
    """The storage a claim requests ("?" when it says nothing)."""
    return str(pvc.get("spec", {}).get("resources", {}).get("requests", {}).get("storage", "?"))


@dataclass(frozen=True)
class ClaimSync:
    """The SandboxClaimSynced condition: does the claim match spec.sandbox, and if not,
    why (for `kubectl describe`)."""

    synced: bool
    reason: str
    message: str


def claim_sync(
    pvc: Mapping[str, Any] | None,
    desired: Mapping[str, Any],
    *,
    problems: Iterable[str] = (),
    refused: tuple[int, str] | None = None,
) -> ClaimSync:
    """The claim's sync state after a reconcile. `refused` is the (HTTP status, API
    message) with which the cluster refused to grow it; `problems` are `plan_claim`'s."""
    problems = list(problems)
    ref = f"{desired['metadata']['namespace']}/{desired['metadata']['name']}"
    if refused is not None:
        status, detail = refused
        have = claim_size(pvc or {})
        message = (
            f"the cluster refused to resize claim {ref} from {have} to "
            f"{claim_size(desired)} (HTTP {status}: {detail}); the sandbox keeps {have}"
        )
        return ClaimSync(False, REASON_RESIZE_REFUSED, "; ".join([message, *problems]))
    if problems:
        return ClaimSync(False, REASON_CLAIM_DRIFT, "; ".join(problems))
    return ClaimSync(True, REASON_IN_SYNC, f"claim {ref} matches spec.sandbox")


def claim_retained(pvc: Mapping[str, Any] | None) -> bool:
    """Whether a live claim is marked `reclaimPolicy: Retain` (kept when unused)."""
    if not pvc:
        return False
    annotations = pvc.get("metadata", {}).get("annotations") or {}
    return annotations.get(ANNOTATION_RECLAIM_POLICY) == "Retain"


# ---- the service Deployment --------------------------------------------------------

class ContainerNotFound(LookupError):
    """The service Deployment has no container with the configured name."""


def deployment_patch(
    deployment: Mapping[str, Any],
    namespace: str,
    name: str,
    target: Target,
    *,
    mounted: bool,
) -> list[dict[str, Any]] | None:
    """The RFC 6902 JSON patch that mounts (or unmounts) one policy's sandbox.

    Only what differs is touched: other volumes and mounts, including other policies'
    sandboxes and the chart's own, are left as they are. Every index the patch relies
    on is guarded by a `test` op, so a Deployment changed since it was read makes the
    patch fail (and the handler retry) rather than remove the wrong entry. Returns None
    when the Deployment is already as wanted. Raises ContainerNotFound when mounting
    into a Deployment without the configured container (unmounting then only removes
    the volume).
    """
    pod = deployment.get("spec", {}).get("template", {}).get("spec", {})
    containers = pod.get("containers") or []
    ci = next((i for i, c in enumerate(containers) if c.get("name") == target.container), None)
    if ci is None and mounted:
        raise ContainerNotFound(
            f"Deployment {target.service_namespace}/{target.deployment} has no container "
            f"named {target.container!r}"
        )
    vname = volume_name(namespace, name)
    want_volume = {"name": vname, "persistentVolumeClaim": {"claimName": claim_name(namespace, name)}}
    want_mount = {"name": vname, "mountPath": sandbox_path(namespace, name, target.mount_root)}

    volumes_path = "/spec/template/spec/volumes"
    ops: list[dict[str, Any]] = []
    if ci is not None:
        mounts_path = f"/spec/template/spec/containers/{ci}/volumeMounts"
        ops += _list_entry_ops(
            containers[ci].get("volumeMounts"), mounts_path, vname, want_mount if mounted else None
        )
        if ops:
            # The container index is only meaningful while that container keeps its name.
            ops.insert(0, {"op": "test", "path": f"/spec/template/spec/containers/{ci}/name",
                           "value": target.container})
    # Mounts go before the volume they name, so removing both never leaves a dangling
    # mount (the API server validates the result of the whole patch anyway).
    ops += _list_entry_ops(pod.get("volumes"), volumes_path, vname, want_volume if mounted else None)
    return ops or None


def _list_entry_ops(
    items: list[dict[str, Any]] | None, path: str, name: str, want: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Ops that make the entry named `name` of the list at `path` equal `want` (None:
    absent). Duplicates with that name are removed, highest index first."""
    found = [i for i, item in enumerate(items or []) if item.get("name") == name]
    ops: list[dict[str, Any]] = []
    if want is None:
        for i in reversed(found):
            ops.append({"op": "test", "path": f"{path}/{i}/name", "value": name})
            ops.append({"op": "remove", "path": f"{path}/{i}"})
        return ops
    if not found:
        if items is None:
            return [{"op": "add", "path": path, "value": [copy.deepcopy(want)]}]
        return [{"op": "add", "path": f"{path}/-", "value": copy.deepcopy(want)}]
    first, extra = found[0], found[1:]
    for i in reversed(extra):
        ops.append({"op": "test", "path": f"{path}/{i}/name", "value": name})
        ops.append({"op": "remove", "path": f"{path}/{i}"})
    if not _covers(items[first], want):  # type: ignore[index]
        ops.append({"op": "test", "path": f"{path}/{first}/name", "value": name})
        ops.append({"op": "replace", "path": f"{path}/{first}", "value": copy.deepcopy(want)})
    return ops


def _covers(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """`have` says everything `want` says (the API server may add defaults, e.g.
    `readOnly: false`, which must not count as a difference)."""
    for key, value in want.items():
        if isinstance(value, Mapping):
            if not isinstance(have.get(key), Mapping) or not _covers(have[key], value):
                return False
        elif have.get(key) != value:
            return False
    return True


def volume_ready(
    pvc: Mapping[str, Any] | None, deployment: Mapping[str, Any] | None
) -> tuple[bool, str]:
    """Whether a sandbox can be used: its claim is Bound and the service Deployment has
    *completely* rolled out the pod template that mounts it. Returns (ready, why-not).

    Complete means what `kubectl rollout status` waits for (kubectl's
    `DeploymentStatusViewer`): the controller observed the current generation, every
    desired pod runs the new template, no old pod is left (`replicas ==
    updatedReplicas`; during a surge an old pod without the mount still takes
    transactions) and every updated pod is available. Anything less, and a transaction
    could be routed to a pod where the sandbox path does not exist.
    """
    if pvc is None:
        return False, "the sandbox claim does not exist yet"
    phase = pvc.get("status", {}).get("phase", "Pending")
    claim = pvc.get("metadata", {}).get("name", "?")
    if phase != "Bound":
        return False, (
            f"claim {claim} is {phase}; check that its StorageClass can provision the "
            "requested access modes (kubectl describe pvc)"
        )
    if deployment is None:
        return False, "the service Deployment does not exist"
    generation = deployment.get("metadata", {}).get("generation", 0)
    status = deployment.get("status") or {}
    desired = deployment.get("spec", {}).get("replicas", 1)
    if status.get("observedGeneration", 0) < generation:
        return False, "the service Deployment has not observed the sandbox mount yet"
    updated = status.get("updatedReplicas", 0)
    total = status.get("replicas", 0)
    available = status.get("availableReplicas", 0)
    if updated < desired:
        progress = f"{updated}/{desired} pods updated"
    elif total > updated:
        progress = f"{total - updated} old pod(s) without the sandbox mount still running"
    elif available < updated:
        progress = f"{available}/{updated} updated pods available"
    else:
        return True, ""
    why = f"the service Deployment is rolling out the sandbox mount ({progress})"
    for cond in status.get("conditions") or []:
        if (isinstance(cond, Mapping) and cond.get("type") == "Progressing"
                and cond.get("reason") == "ProgressDeadlineExceeded"):
            why += f"; its rollout exceeded the progress deadline: {cond.get('message', '')}"
    return False, why


# ---- status ------------------------------------------------------------------------

class Keep(enum.Enum):
    """`build_status(claim_sync=KEEP)`: leave that condition as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP


def find_condition(status: Any, kind: str) -> dict[str, Any] | None:
    """The condition of type `kind` in a status (None: absent)."""
    for cond in (status or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return dict(cond)
    return None


def _condition(
    old: Mapping[str, Any] | None, kind: str, ok: bool, reason: str, message: str,
    generation: int, now: str,
) -> dict[str, Any]:
    cond_status = "True" if ok else "False"
    transition = now
    if old and old.get("status") == cond_status and old.get("lastTransitionTime"):
        transition = old["lastTransitionTime"]
    return {
        "type": kind,
        "status": cond_status,
        "observedGeneration": generation,
        "lastTransitionTime": transition,
        "reason": reason,
        "message": message[:32768],
    }


def build_status(
    old_status: Mapping[str, Any] | None,
    *,
    generation: int,
    reason: str,
    message: str,
    sandbox_claim: str | None,
    now: str,
    claim_sync: ClaimSync | None | Keep = KEEP,
) -> dict[str, Any]:
    """The policy's status: observedGeneration, sandboxClaim and the conditions.

    Ready is True only for `Published`. SandboxClaimSynced is set from `claim_sync`,
    removed when it is None (no sandbox), left as it was for KEEP. `lastTransitionTime`
    moves only when a condition's status flips (Kubernetes' convention), so reconciling
    an unchanged policy yields an identical status. Other conditions are kept as they
    were; ours come last, SandboxClaimSynced before Ready.
    """
    old_status = old_status or {}
    old_conditions = [c for c in old_status.get("conditions") or [] if isinstance(c, Mapping)]
    ours = {CONDITION_READY, CONDITION_CLAIM_SYNCED}
    conditions = [dict(c) for c in old_conditions if c.get("type") not in ours]
    old_claim = find_condition(old_status, CONDITION_CLAIM_SYNCED)
    if claim_sync is KEEP:
        if old_claim is not None:
            conditions.append(old_claim)
    elif claim_sync is not None:
        conditions.append(_condition(old_claim, CONDITION_CLAIM_SYNCED, claim_sync.synced,
                                     claim_sync.reason, claim_sync.message, generation, now))
    conditions.append(_condition(find_condition(old_status, CONDITION_READY), CONDITION_READY,
                                 reason == REASON_PUBLISHED, reason, message, generation, now))
    status: dict[str, Any] = {"observedGeneration": generation, "conditions": conditions}
    status["sandboxClaim"] = sandbox_claim or ""
    return status


def status_patch(
    old_status: Mapping[str, Any] | None, new_status: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The fields of `new_status` that differ from `old_status` (None: nothing to write)."""
    old_status = old_status or {}
    diff = {k: v for k, v in new_status.items() if old_status.get(k) != v}
    return diff or None


# ---- deletion ----------------------------------------------------------------------

@dataclass(frozen=True)
class DeleteActions:
    """What the finalizer does before it lets a policy go."""

    unpublish: bool
    unmount: bool
    delete_claim: bool


def delete_actions(spec: Any) -> DeleteActions:
    """Unpublish always; unmount always (a mount of a deleted policy would never be
    removed by anyone); delete the claim unless `sandbox.reclaimPolicy: Retain`.

    Tolerates any spec (an InvalidSpec policy must be deletable too)."""
    sandbox = spec.get("sandbox") if isinstance(spec, Mapping) else None
    retain = isinstance(sandbox, Mapping) and sandbox.get("reclaimPolicy") == "Retain"
    return DeleteActions(unpublish=True, unmount=True, delete_claim=not retain)


def orphaned_keys(
    published: Mapping[bytes, int],
    existing: Iterable[tuple[str, str]],
    keys: Keys,
    namespaces: Iterable[str] | None = None,
) -> dict[bytes, int]:
    """Published keys (key -> mod_revision) whose policy no longer exists.

    Only keys under `keys.policies_prefix()` in the watched `namespaces` (None: all) are
    considered, so operators watching other namespaces of a shared prefix are safe.
    The caller reads etcd before listing the policies and deletes each orphan with a
    compare on its mod_revision, so a policy published in between is never removed.
    """
    base = keys.policies_prefix()
    alive = {keys.policy(ns, n) for ns, n in existing}
    watched = None if namespaces is None else set(namespaces)
    orphans: dict[bytes, int] = {}
    for key, rev in published.items():
        if not key.startswith(base) or key in alive:
            continue
        ns = key[len(base):].split(b"/", 1)[0].decode("utf-8", "replace")
        if watched is not None and ns not in watched:
            continue
        orphans[key] = rev
    return orphans


def retry_delay(retry: int, base: float, cap: float) -> float:
    """Exponential backoff for kopf.TemporaryError: base * 2**retry, at most cap."""
    return float(min(cap, base * (2 ** max(0, min(retry, 30)))))
