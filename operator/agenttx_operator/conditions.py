"""The policy's status: its conditions, their reasons, and the status patch.

Why a module of its own: `kubectl get/describe agenttxpolicy` is how a person learns
what the operator did, so what the status says (Ready and its reasons, whether the
sandbox claim matches the spec) is decided in one place, unit-tested without an API
server, and shared by every handler.

What it must never do: perform I/O or read the clock (callers pass `now`). Building the
status of an unchanged policy again yields an identical status, so a second reconcile
writes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class ClaimSync:
    """The SandboxClaimSynced condition: does the claim match spec.sandbox, and if not,
    why (for `kubectl describe`)."""

    synced: bool
    reason: str
    message: str


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


def condition(
    old: Mapping[str, Any] | None, kind: str, ok: bool, reason: str, message: str,
    generation: int, now: str,
) -> dict[str, Any]:
    """One condition; `lastTransitionTime` moves only when its status flips."""
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
        conditions.append(condition(old_claim, CONDITION_CLAIM_SYNCED, claim_sync.synced,
                                     claim_sync.reason, claim_sync.message, generation, now))
    conditions.append(condition(find_condition(old_status, CONDITION_READY), CONDITION_READY,
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
