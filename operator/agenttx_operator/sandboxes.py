"""A policy's sandbox: where it is mounted, what its objects are called, and the
PersistentVolumeClaim that backs it (built, compared with the live claim, reported).

Why a module of its own: the claim lives in the service's namespace, not the policy's,
so its name, labels and annotations are the only link back to the policy; they are
derived here, deterministically, so every reconcile finds the same claim.

What it must never do: perform I/O or mutate its arguments. Every builder is
idempotent: feeding its own output back in yields "nothing to do".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .conditions import REASON_CLAIM_DRIFT, REASON_IN_SYNC, REASON_RESIZE_REFUSED, ClaimSync
from .naming import dns_name, identity_hash

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

# What spec.sandbox may ask for (the CRD schema's enums).
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
DEFAULT_ACCESS_MODES = ("ReadWriteMany",)
RECLAIM_POLICIES = ("Delete", "Retain")

# apimachinery's resource.Quantity grammar, as controller-gen renders it into CRDs.
QUANTITY_RE = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


@dataclass(frozen=True)
class Target:
    """Where sandboxes go: the service's namespace, Deployment and container."""

    service_namespace: str
    deployment: str = "agenttx"
    container: str = "agenttx"
    mount_root: str = DEFAULT_MOUNT_ROOT


def sandbox_path(namespace: str, name: str, mount_root: str = DEFAULT_MOUNT_ROOT) -> str:
    """The directory a policy's sandbox is mounted at in every service pod."""
    return f"{mount_root.rstrip('/')}/{namespace}/{name}"


# ---- names -------------------------------------------------------------------------

def _policy_hash(namespace: str, name: str) -> str:
    return identity_hash(namespace, name)


def claim_name(namespace: str, name: str) -> str:
    """The sandbox PVC's name in the service namespace (a DNS subdomain, <= 253)."""
    return dns_name("sandbox", namespace, name, 253)


def volume_name(namespace: str, name: str) -> str:
    """The pod volume's name (a DNS-1123 label, <= 63)."""
    return dns_name("sbx", namespace, name, 63)


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
