"""The service Deployment: the JSON patch that mounts or unmounts one volume (a policy's
sandbox, a toolset's header files), and whether the rollout that carries it is complete.

Why a module of its own: the Deployment belongs to the chart and holds other policies'
sandboxes and toolsets' files too, so the operator touches only its own entries, guarded
by `test` ops; and nothing that needs a volume may be published before every pod that
could take a transaction has it.

What it must never do: perform I/O or mutate its arguments.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .sandboxes import Target, claim_name, sandbox_path, volume_name


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
    """The RFC 6902 JSON patch that mounts (or unmounts) one policy's sandbox; see
    `volume_patch`."""
    vname = volume_name(namespace, name)
    want_volume = {"name": vname, "persistentVolumeClaim": {"claimName": claim_name(namespace, name)}}
    want_mount = {"name": vname, "mountPath": sandbox_path(namespace, name, target.mount_root)}
    return volume_patch(deployment, target, vname,
                        want_volume if mounted else None, want_mount if mounted else None)


def volume_patch(
    deployment: Mapping[str, Any],
    target: Target,
    vname: str,
    want_volume: dict[str, Any] | None,
    want_mount: dict[str, Any] | None,
) -> list[dict[str, Any]] | None:
    """The RFC 6902 JSON patch that makes the pod volume `vname` and the service
    container's mount of it equal `want_volume` / `want_mount` (None: absent).

    Only what differs is touched: other volumes and mounts, including other policies'
    sandboxes, other toolsets' files and the chart's own, are left as they are. Every
    index the patch relies on is guarded by a `test` op, so a Deployment changed since it
    was read makes the patch fail (and the handler retry) rather than remove the wrong
    entry. Returns None when the Deployment is already as wanted. Raises
    ContainerNotFound when mounting into a Deployment without the configured container
    (unmounting then only removes the volume).
    """
    mounted = want_mount is not None
    pod = deployment.get("spec", {}).get("template", {}).get("spec", {})
    containers = pod.get("containers") or []
    ci = next((i for i, c in enumerate(containers) if c.get("name") == target.container), None)
    if ci is None and mounted:
        raise ContainerNotFound(
            f"Deployment {target.service_namespace}/{target.deployment} has no container "
            f"named {target.container!r}"
        )

    volumes_path = "/spec/template/spec/volumes"
    ops: list[dict[str, Any]] = []
    if ci is not None:
        mounts_path = f"/spec/template/spec/containers/{ci}/volumeMounts"
        ops += _list_entry_ops(
            containers[ci].get("volumeMounts"), mounts_path, vname, want_mount
        )
        if ops:
            # The container index is only meaningful while that container keeps its name.
            ops.insert(0, {"op": "test", "path": f"/spec/template/spec/containers/{ci}/name",
                           "value": target.container})
    # Mounts go before the volume they name, so removing both never leaves a dangling
    # mount (the API server validates the result of the whole patch anyway).
    ops += _list_entry_ops(pod.get("volumes"), volumes_path, vname, want_volume)
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
    return rollout_complete(deployment, "the sandbox mount")


def rollout_complete(deployment: Mapping[str, Any] | None, what: str) -> tuple[bool, str]:
    """Whether the service Deployment has completely rolled out its current pod
    template, which carries `what` (e.g. "the sandbox mount"); (done, why-not). See
    `volume_ready` for what complete means."""
    if deployment is None:
        return False, "the service Deployment does not exist"
    generation = deployment.get("metadata", {}).get("generation", 0)
    status = deployment.get("status") or {}
    desired = deployment.get("spec", {}).get("replicas", 1)
    if status.get("observedGeneration", 0) < generation:
        return False, f"the service Deployment has not observed {what} yet"
    updated = status.get("updatedReplicas", 0)
    total = status.get("replicas", 0)
    available = status.get("availableReplicas", 0)
    if updated < desired:
        progress = f"{updated}/{desired} pods updated"
    elif total > updated:
        progress = f"{total - updated} old pod(s) without {what} still running"
    elif available < updated:
        progress = f"{available}/{updated} updated pods available"
    else:
        return True, ""
    why = f"the service Deployment is rolling out {what} ({progress})"
    for cond in status.get("conditions") or []:
        if (isinstance(cond, Mapping) and cond.get("type") == "Progressing"
                and cond.get("reason") == "ProgressDeadlineExceeded"):
            why += f"; its rollout exceeded the progress deadline: {cond.get('message', '')}"
    return False, why
