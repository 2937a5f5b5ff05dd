"""What the finalizer does when a policy goes, which published keys are orphans, and how
long to wait before a retry.

Why a module of its own: deleting must never get stuck and never remove what a newer
policy published, so these decisions are pure, unit-tested functions that the handlers
and the orphan sweep call.

What it must never do: perform I/O or build an etcd key itself (keys come from
`agenttx.contracts.layout.Keys`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agenttx.contracts.layout import Keys


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
    alive = {keys.policy(ns, n) for ns, n in existing}
    watched = None if namespaces is None else set(namespaces)
    orphans: dict[bytes, int] = {}
    for key, rev in published.items():
        ref = keys.policy_of(key)
        if ref is None or key in alive:
            continue
        if watched is not None and ref[0] not in watched:
            continue
        orphans[key] = rev
    return orphans


def retry_delay(retry: int, base: float, cap: float) -> float:
    """Exponential backoff for kopf.TemporaryError: base * 2**retry, at most cap."""
    return float(min(cap, base * (2 ** max(0, min(retry, 30)))))


def orphaned_toolset_keys(
    published: Mapping[bytes, int],
    existing: Iterable[tuple[str, str]],
    keys: Keys,
    namespaces: Iterable[str] | None = None,
) -> dict[bytes, int]:
    """Published toolset keys (key -> mod_revision) whose AgentTxToolset no longer exists.

    Only keys under the watched namespaces' toolset prefixes are considered (all of
    `keys.toolsets_prefix()` when `namespaces` is None), so operators watching other
    namespaces of a shared prefix are safe. The caller reads etcd first and deletes with
    a compare on the mod_revision (see `orphaned_keys`)."""
    alive = {keys.toolset(ns, n) for ns, n in existing}
    scopes = ([keys.toolsets_prefix()] if namespaces is None
              else [keys.toolset(ns, "") for ns in namespaces])
    return {key: rev for key, rev in published.items()
            if key not in alive and any(key.startswith(scope) for scope in scopes)}
