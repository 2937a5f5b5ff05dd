"""Published rollback policies: the record the operator writes at
`<prefix>/policies/<ns>/<name>` and the service watches, its codec, and the ranges every
schema enforces (API validation, the CRD, the chart's copy and `values.schema.json`; a
test checks they agree with the constants here).

One home: the operator imports this module (never the engine), the engine imports it to
resolve a transaction's policy (`agenttx.engine.policy`). Pure: no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
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


__all__ = ["DEPTH_MAX", "DEPTH_MIN", "FACTOR_MAX", "FACTOR_MIN", "SERVER_DEFAULT_SOURCE",
           "PublishedPolicy", "RollbackSettings", "parse_published_policy", "policy_to_json"]
