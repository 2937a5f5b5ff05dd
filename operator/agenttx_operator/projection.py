"""A toolset's header values in the service pods: the Secret the operator keeps in the
service's namespace, and the read-only volume that projects it into the service
container at `<root>/<toolset ns>/<toolset name>/<secret>/<key>`.

Why a copy: a pod volume can only name Secrets of the pod's own namespace, and a
toolset's Secrets live in the toolset's namespace. So the operator copies exactly the
keys the toolset's headers name (nothing else of those Secrets) into one Secret per
toolset in the service's namespace, which it owns, and the service pods mount that. The
service's ServiceAccount still needs no API access, and no value ever goes to etcd.

Why a key -> path list (`items`) in the volume rather than every key of the copy: the
pod template then says which files each pod has, so "rolled out" (`mounts.rollout_complete`)
means every pod that could take a transaction has every file the published toolset
reads. While a new generation is pending, the copy and the list hold the union of the
old files and the new (`merge_items`), so the generation still published never loses a
file; once the new one is published, `prune` drops what it no longer needs.

What it must never do: perform I/O, mutate its arguments, or decode a value (values are
copied as the API server's base64, untouched).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from .naming import dns_name, identity_hash
from .sandboxes import LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY, Target
from .toolset_spec import DEFAULT_MOUNT_ROOT, SecretRef, file_path, mount_path

COMPONENT = "toolset-headers"
LABEL_TOOLSET_HASH = "agenttx.io/toolset-hash"
ANNOTATION_TOOLSET = "agenttx.io/toolset"
# Files readable by the owner and the group: the chart runs the service with fsGroup,
# so the service's group reads them, nobody else does (the chart's own Secret mounts
# use 0440 too).
FILE_MODE = 0o440
MAX_KEY_LEN = 253  # a Secret data key (apimachinery's IsConfigMapKey)


def secret_name(namespace: str, name: str) -> str:
    """The operator's copy of a toolset's header values, in the service namespace."""
    return dns_name("toolset", namespace, name, 253)


def volume_name(namespace: str, name: str) -> str:
    """The pod volume that projects that copy (a DNS-1123 label, <= 63)."""
    return dns_name("tset", namespace, name, 63)


def copy_key(ref: SecretRef) -> str:
    """The key of `ref`'s value in the copy: `<secret>_<key>`, which is unique (a Secret
    name has no `_`), or a hash of both when that is longer than a key may be."""
    readable = f"{ref.secret}_{ref.key}"
    if len(readable) <= MAX_KEY_LEN:
        return readable
    return "h-" + hashlib.sha256(f"{ref.secret}\0{ref.key}".encode()).hexdigest()


def items(refs: Iterable[SecretRef]) -> list[dict[str, Any]]:
    """The volume's key -> path list for `refs`, sorted by path (a stable template)."""
    return sorted(({"key": copy_key(r), "path": file_path(r)} for r in set(refs)),
                  key=lambda item: item["path"])


def merge_items(current: Iterable[Mapping[str, Any]], wanted: Iterable[Mapping[str, Any]]
                ) -> list[dict[str, Any]]:
    """The union of two item lists (by path; `wanted` wins), sorted by path."""
    by_path = {str(i["path"]): dict(i) for i in current}
    by_path.update({str(i["path"]): dict(i) for i in wanted})
    return [by_path[p] for p in sorted(by_path)]


def build_secret(namespace: str, name: str, values: Mapping[SecretRef, str],
                 target: Target, *, keep: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The copy of a toolset's header values: `values` maps each Secret key to its
    base64 value as the API server serves it; `keep` (base64 by copy key) are values of
    the generation still published, kept until the new one is."""
    data = dict(keep or {})
    data.update({copy_key(ref): value for ref, value in values.items()})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(namespace, name),
            "namespace": target.service_namespace,
            "labels": {
                LABEL_MANAGED_BY: MANAGED_BY,
                LABEL_COMPONENT: COMPONENT,
                LABEL_TOOLSET_HASH: identity_hash(namespace, name)[:16],
            },
            "annotations": {ANNOTATION_TOOLSET: f"{namespace}/{name}"},
        },
        "data": data,
    }


def secret_patch(existing: Mapping[str, Any], desired: Mapping[str, Any]
                 ) -> dict[str, Any] | None:
    """The merge patch that makes a live copy hold exactly `desired`'s data (a key
    absent from it is removed) and its labels/annotations; None when nothing differs."""
    patch: dict[str, Any] = {}
    have = existing.get("data") or {}
    want = desired.get("data") or {}
    data: dict[str, Any] = {k: v for k, v in want.items() if have.get(k) != v}
    data.update({k: None for k in have if k not in want})
    if data:
        patch["data"] = data
    meta: dict[str, Any] = {}
    for field in ("labels", "annotations"):
        live = (existing.get("metadata") or {}).get(field) or {}
        diff = {k: v for k, v in desired["metadata"][field].items() if live.get(k) != v}
        if diff:
            meta[field] = diff
    if meta:
        patch["metadata"] = meta
    return patch or None


def volume(namespace: str, name: str, file_items: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod volume. `optional: true`: a service pod must never fail to start because
    of a toolset (the copy is created before the volume, and deleted after it goes)."""
    return {
        "name": volume_name(namespace, name),
        "secret": {
            "secretName": secret_name(namespace, name),
            "items": copy.deepcopy(file_items),
            "defaultMode": FILE_MODE,
            "optional": True,
        },
    }


def mount(namespace: str, name: str, mount_root: str = DEFAULT_MOUNT_ROOT) -> dict[str, Any]:
    """The service container's read-only mount of that volume (never `subPath`, so a
    rotated value reaches the running pods without a restart)."""
    return {"name": volume_name(namespace, name),
            "mountPath": mount_path(namespace, name, mount_root), "readOnly": True}


def live_items(deployment: Mapping[str, Any] | None, namespace: str, name: str
               ) -> list[dict[str, Any]]:
    """The key -> path list the Deployment's template projects for a toolset ([] when
    it has no such volume)."""
    pod = ((deployment or {}).get("spec") or {}).get("template", {}).get("spec", {})
    vname = volume_name(namespace, name)
    for v in pod.get("volumes") or []:
        if v.get("name") == vname:
            return [dict(i) for i in (v.get("secret") or {}).get("items") or []]
    return []
