"""An AgentTxPolicy's spec: the resource's identity, its validation, and the record it
becomes when published (`agenttx.contracts.policy.PublishedPolicy`).

Why a module of its own: the CRD schema enforces most of this, but an object can reach
the operator without that schema (an old CRD) and a schema cannot say everything (a
byte length), so the operator checks again, with the ranges the service uses
(`agenttx.contracts.policy`), and says which field is wrong.

What it must never do: perform I/O or mutate its arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agenttx.contracts.policy import (
    DEPTH_MAX,
    DEPTH_MIN,
    FACTOR_MAX,
    FACTOR_MIN,
    PublishedPolicy,
    approval_from_spec,
    policy_to_json,
)

from .sandboxes import (
    ACCESS_MODES,
    DEFAULT_ACCESS_MODES,
    DEFAULT_MOUNT_ROOT,
    QUANTITY_RE,
    RECLAIM_POLICIES,
    sandbox_path,
)

GROUP = "agenttx.io"
VERSION = "v1alpha1"
PLURAL = "agenttxpolicies"
KIND = "AgentTxPolicy"

# Limits of the selector the API enforces on BeginTransaction (docs/api.md); the
# operator's own check, for what the CRD schema cannot express (a byte length).
AGENT_ID_PREFIX_MAX_BYTES = 256
MATCH_METADATA_MAX = 64
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

_SPEC_FIELDS = {"priority", "selector", "rollback", "sandbox", "idleTimeoutSeconds",
                "approval"}
_SELECTOR_FIELDS = {"agentIdPrefix", "matchMetadata"}
_ROLLBACK_FIELDS = {"maxLocalDepth", "maxGlobalResets", "replayBudgetFactor"}
_SANDBOX_FIELDS = {"size", "storageClassName", "accessModes", "reclaimPolicy"}


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

    if "approval" in spec:
        try:  # the service's own parser and ranges (agenttx.contracts.policy)
            approval_from_spec(spec["approval"], "spec.approval")
        except ValueError as exc:  # "spec.approval.<field>: <what is wrong>"
            errors.append(str(exc))
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
        approval=approval_from_spec(spec["approval"], "spec.approval")
        if "approval" in spec else None,
    )


def publish_payload(policy: PublishedPolicy) -> bytes:
    """The bytes stored under `Keys.policy`: the service's wire format, byte-stable."""
    return policy_to_json(policy)
