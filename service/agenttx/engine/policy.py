"""Rollback policies: what the operator publishes, which one applies, and the result.

A transaction's effective policy is resolved once, at begin (SPEC §2): server defaults,
overlaid with the set fields of the most specific matching `AgentTxPolicy` (§8), overlaid
with the fields set in the request's `policy`. This module holds that logic as pure
functions over plain data so the service (which watches `<prefix>/policies/` in etcd) and
the operator (which writes there) share one wire format and one set of range checks.
It never reads etcd or the Kubernetes API itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Ranges shared with the API validation and the CRD schema (SPEC §1, §8).
DEPTH_MIN, DEPTH_MAX = 0, 16
FACTOR_MIN, FACTOR_MAX = 0.1, 1000.0

SERVER_DEFAULT_SOURCE = "server-default"


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{name} must be an integer between {DEPTH_MIN} and {DEPTH_MAX}, got {value!r}"
        )
    if not DEPTH_MIN <= value <= DEPTH_MAX:
        raise ValueError(f"{name} must be between {DEPTH_MIN} and {DEPTH_MAX}, got {value}")
    return value


def _check_factor(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"{name} must be a finite number between {FACTOR_MIN:g} and {FACTOR_MAX:g}, "
            f"got {value!r}"
        )
    f = float(value)
    if not math.isfinite(f) or not FACTOR_MIN <= f <= FACTOR_MAX:
        raise ValueError(
            f"{name} must be a finite number between {FACTOR_MIN:g} and {FACTOR_MAX:g}, "
            f"got {value!r}"
        )
    return f


@dataclass(frozen=True)
class RollbackSettings:
    """The rollback limits of a policy (SPEC §5 defaults). Range-checked on construction."""

    max_local_depth: int = 3
    max_global_resets: int = 1
    replay_budget_factor: float = 2.0

    def __post_init__(self) -> None:
        _check_count("max_local_depth", self.max_local_depth)
        _check_count("max_global_resets", self.max_global_resets)
        # Normalise an integer factor (JSON `2`) to float so equal settings compare equal.
        factor = _check_factor("replay_budget_factor", self.replay_budget_factor)
        object.__setattr__(self, "replay_budget_factor", factor)


@dataclass(frozen=True)
class PublishedPolicy:
    """An `AgentTxPolicy` as the operator publishes it at `<prefix>/policies/<ns>/<name>`.

    Rollback fields and the idle timeout are None when the policy leaves them unset, so
    the layer below shows through. Validated on construction (same ranges as the API).
    """

    namespace: str
    name: str
    generation: int
    priority: int
    agent_id_prefix: str = ""  # "" matches any agent
    match_metadata: Mapping[str, str] = field(default_factory=dict)
    max_local_depth: int | None = None
    max_global_resets: int | None = None
    replay_budget_factor: float | None = None
    idle_timeout_s: int | None = None
    sandbox_path: str | None = None  # e.g. "/sandboxes/<ns>/<name>"

    def __post_init__(self) -> None:
        for name in ("namespace", "name"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("generation", "priority"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.generation < 0:
            raise ValueError(f"generation must be >= 0, got {self.generation}")
        if not isinstance(self.agent_id_prefix, str):
            raise ValueError(
                f"selector.agent_id_prefix must be a string, got {self.agent_id_prefix!r}"
            )
        if not isinstance(self.match_metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.match_metadata.items()
        ):
            raise ValueError(
                f"selector.match_metadata must map strings to strings, got {self.match_metadata!r}"
            )
        object.__setattr__(self, "match_metadata", dict(self.match_metadata))
        if self.max_local_depth is not None:
            _check_count("rollback.max_local_depth", self.max_local_depth)
        if self.max_global_resets is not None:
            _check_count("rollback.max_global_resets", self.max_global_resets)
        if self.replay_budget_factor is not None:
            factor = _check_factor("rollback.replay_budget_factor", self.replay_budget_factor)
            object.__setattr__(self, "replay_budget_factor", factor)
        if self.idle_timeout_s is not None and (
            isinstance(self.idle_timeout_s, bool)
            or not isinstance(self.idle_timeout_s, int)
            or self.idle_timeout_s < 1
        ):
            raise ValueError(
                f"idle_timeout_s must be a positive integer or null, got {self.idle_timeout_s!r}"
            )
        if self.sandbox_path is not None and (
            not isinstance(self.sandbox_path, str) or not self.sandbox_path.startswith("/")
        ):
            raise ValueError(
                f"sandbox_path must be an absolute path or null, got {self.sandbox_path!r}"
            )

    @property
    def key(self) -> str:
        """`<ns>/<name>`, the policy's identity and its etcd key suffix."""
        return f"{self.namespace}/{self.name}"


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def parse_published_policy(raw: bytes) -> PublishedPolicy:
    """Decode a published policy (the JSON written by `policy_to_json`).

    Raises ValueError naming the problem on bad UTF-8/JSON, a missing or mistyped field,
    or a value out of range. Unknown keys are ignored, so an operator that publishes a
    newer format does not break older service replicas during a rolling upgrade.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"invalid published policy: not UTF-8 ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid published policy: malformed JSON ({exc})") from None
    try:
        top = _object(doc, "policy")
        missing = [k for k in ("namespace", "name", "generation", "priority") if k not in top]
        if missing:
            raise ValueError(f"missing field(s): {', '.join(missing)}")
        selector = _object(top.get("selector", {}), "selector")
        rollback = _object(top.get("rollback", {}), "rollback")
        return PublishedPolicy(
            namespace=top["namespace"],
            name=top["name"],
            generation=top["generation"],
            priority=top["priority"],
            agent_id_prefix=selector.get("agent_id_prefix", ""),
            match_metadata=_object(selector.get("match_metadata", {}), "selector.match_metadata"),
            max_local_depth=rollback.get("max_local_depth"),
            max_global_resets=rollback.get("max_global_resets"),
            replay_budget_factor=rollback.get("replay_budget_factor"),
            idle_timeout_s=top.get("idle_timeout_s"),
            sandbox_path=top.get("sandbox_path"),
        )
    except ValueError as exc:
        raise ValueError(f"invalid published policy: {exc}") from None


def policy_to_json(p: PublishedPolicy) -> bytes:
    """Encode `p` for etcd; the inverse of `parse_published_policy`.

    Keys come in a fixed order (metadata keys sorted) so equal policies encode to equal
    bytes and an unchanged policy is never rewritten.
    """
    rollback: dict[str, int | float] = {}
    if p.max_local_depth is not None:
        rollback["max_local_depth"] = p.max_local_depth
    if p.max_global_resets is not None:
        rollback["max_global_resets"] = p.max_global_resets
    if p.replay_budget_factor is not None:
        rollback["replay_budget_factor"] = p.replay_budget_factor
    doc = {
        "namespace": p.namespace,
        "name": p.name,
        "generation": p.generation,
        "priority": p.priority,
        "selector": {
            "agent_id_prefix": p.agent_id_prefix,
            "match_metadata": dict(sorted(p.match_metadata.items())),
        },
        "rollback": rollback,
        "idle_timeout_s": p.idle_timeout_s,
        "sandbox_path": p.sandbox_path,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def matches(p: PublishedPolicy, agent_id: str, metadata: Mapping[str, str]) -> bool:
    """True when `agent_id` starts with the prefix and every matchMetadata pair is present."""
    if not agent_id.startswith(p.agent_id_prefix):
        return False
    return all(metadata.get(k) == v for k, v in p.match_metadata.items())


def _specificity(p: PublishedPolicy) -> tuple[int, int, int, str, int]:
    # min() of this key is the winner: highest priority, longest prefix, most metadata
    # keys, then "<ns>/<name>" ascending; generation (highest) only separates duplicates.
    return (-p.priority, -len(p.agent_id_prefix), -len(p.match_metadata), p.key, -p.generation)


def select_policy(
    policies: Iterable[PublishedPolicy], agent_id: str, metadata: Mapping[str, str]
) -> PublishedPolicy | None:
    """The most specific policy matching the agent (SPEC §8), or None if none matches."""
    candidates = [p for p in policies if matches(p, agent_id, metadata)]
    if not candidates:
        return None
    return min(candidates, key=_specificity)


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy a transaction runs under; resolved once at begin and stored with it."""

    rollback: RollbackSettings
    idle_timeout_s: int
    sandbox_path: str | None  # None: the server's default fs root
    source: str  # "server-default" or "<ns>/<name>@<generation>"


def resolve_policy(
    *,
    defaults: RollbackSettings,
    default_idle_timeout_s: int,
    published: PublishedPolicy | None,
    request_max_local_depth: int | None,
    request_max_global_resets: int | None,
    request_replay_budget_factor: float | None,
) -> EffectivePolicy:
    """Layer server defaults <- published policy's set fields <- request's set fields.

    Each field is taken independently from the highest layer that sets it. `source`
    names the published policy even when the request overrides some of its fields.
    Raises ValueError if a request value is out of range.
    """
    depth = defaults.max_local_depth
    resets = defaults.max_global_resets
    factor = defaults.replay_budget_factor
    idle = default_idle_timeout_s
    sandbox: str | None = None
    source = SERVER_DEFAULT_SOURCE
    if published is not None:
        if published.max_local_depth is not None:
            depth = published.max_local_depth
        if published.max_global_resets is not None:
            resets = published.max_global_resets
        if published.replay_budget_factor is not None:
            factor = published.replay_budget_factor
        if published.idle_timeout_s is not None:
            idle = published.idle_timeout_s
        sandbox = published.sandbox_path
        source = f"{published.key}@{published.generation}"
    if request_max_local_depth is not None:
        depth = request_max_local_depth
    if request_max_global_resets is not None:
        resets = request_max_global_resets
    if request_replay_budget_factor is not None:
        factor = request_replay_budget_factor
    return EffectivePolicy(
        rollback=RollbackSettings(
            max_local_depth=depth, max_global_resets=resets, replay_budget_factor=factor
        ),
        idle_timeout_s=idle,
        sandbox_path=sandbox,
        source=source,
    )
