"""Published rollback policies: the record the operator writes at
`<prefix>/policies/<ns>/<name>` and the service watches, its codec, and the ranges every
schema enforces (API validation, the CRD, the chart's copy and `values.schema.json`; a
test checks they agree with the constants here).

A policy may also say which steps need a person's approval before they commit
(`ApprovalSettings`, docs/approvals.md): the same record, in the same three places (the
CRD's `spec.approval`, the default policy's `AGENTTX_DEFAULT_POLICY__APPROVAL`, the
published JSON), parsed and range-checked here only.

One home: the operator imports this module (never the engine), the engine imports it to
resolve a transaction's policy (`agenttx.engine.policy`). Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Ranges shared with the API validation and the CRD schema (SPEC §1, §8).
DEPTH_MIN, DEPTH_MAX = 0, 16
FACTOR_MIN, FACTOR_MAX = 0.1, 1000.0

SERVER_DEFAULT_SOURCE = "server-default"

# Approvals (docs/approvals.md). The timeout's floor is technical (the reaper's sweep runs
# every few seconds, so a shorter wait could not be kept); its ceiling is 30 days, past
# which nobody should hold locks and open transactions waiting for a decision.
APPROVAL_TIMEOUT_MIN_S, APPROVAL_TIMEOUT_MAX_S = 5, 2_592_000
APPROVAL_TIMEOUT_DEFAULT_S = 86_400
# Bounds that keep a transaction header (where the effective approval is stored) small.
APPROVAL_MAX_REQUIREMENTS = 64
APPROVAL_MAX_APPROVERS = 64
APPROVAL_PATTERN_MAX_CHARS = 253     # a tool glob or a channel name
APPROVAL_PRINCIPAL_MAX_CHARS = 512   # e.g. a SPIFFE id or system:serviceaccount:<ns>:<sa>
REQUIREMENT_KINDS = ("tool", "channel")


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
class Requirement:
    """One entry of `approval.required`: `tool` is a glob on AgentTx tool names
    (`fnmatch` rules: `*`, `?`, `[...]`; `tickets.*`), `channel` an effect channel's name
    (an `effect.stage` on it is gated)."""

    kind: str       # "tool" | "channel"
    pattern: str

    def __post_init__(self) -> None:
        if self.kind not in REQUIREMENT_KINDS:
            raise ValueError(f"kind: must be `tool` or `channel`, got {self.kind!r}")
        if not isinstance(self.pattern, str) or not self.pattern.strip():
            raise ValueError(f"{self.kind}: must be a non-empty string, got {self.pattern!r}")
        if len(self.pattern) > APPROVAL_PATTERN_MAX_CHARS:
            raise ValueError(f"{self.kind}: at most {APPROVAL_PATTERN_MAX_CHARS} characters, "
                             f"got {len(self.pattern)}")

    def doc(self) -> dict[str, str]:
        return {self.kind: self.pattern}


@dataclass(frozen=True)
class ApprovalSettings:
    """`spec.approval` of one layer (the default policy, a published policy), or the
    effective approval of a transaction once resolved (`resolve_approval`).

    `approvers`, `timeout_s` and `notify_channel` are None when the layer leaves them
    unset (the layer below shows through); `required` is never removed by a layer
    above, only added to. An empty `approvers` means every principal with the
    `approver` role in scope (admins always may); `notify_channel` "" means none.
    """

    required: tuple[Requirement, ...] = ()
    approvers: tuple[str, ...] | None = None
    timeout_s: int | None = None
    notify_channel: str | None = None

    def __post_init__(self) -> None:
        if len(self.required) > APPROVAL_MAX_REQUIREMENTS:
            raise ValueError(f"required: at most {APPROVAL_MAX_REQUIREMENTS} entries, got "
                             f"{len(self.required)}")
        object.__setattr__(self, "required", tuple(dict.fromkeys(self.required)))
        if self.approvers is not None:
            if isinstance(self.approvers, str) or not all(
                    isinstance(a, str) and a and len(a) <= APPROVAL_PRINCIPAL_MAX_CHARS
                    for a in self.approvers):
                raise ValueError("approvers: must be a list of principals (non-empty strings "
                                 f"of at most {APPROVAL_PRINCIPAL_MAX_CHARS} characters), got "
                                 f"{self.approvers!r}")
            if len(self.approvers) > APPROVAL_MAX_APPROVERS:
                raise ValueError(f"approvers: at most {APPROVAL_MAX_APPROVERS} principals, "
                                 f"got {len(self.approvers)}")
            object.__setattr__(self, "approvers", tuple(dict.fromkeys(self.approvers)))
        if self.timeout_s is not None and (
                isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int)
                or not APPROVAL_TIMEOUT_MIN_S <= self.timeout_s <= APPROVAL_TIMEOUT_MAX_S):
            raise ValueError(f"timeoutSeconds: must be an integer between "
                             f"{APPROVAL_TIMEOUT_MIN_S} and {APPROVAL_TIMEOUT_MAX_S}, got "
                             f"{self.timeout_s!r}")
        if self.notify_channel is not None and (
                not isinstance(self.notify_channel, str)
                or len(self.notify_channel) > APPROVAL_PATTERN_MAX_CHARS):
            raise ValueError(f"notifyChannel: must be a channel name (at most "
                             f"{APPROVAL_PATTERN_MAX_CHARS} characters) or \"\", got "
                             f"{self.notify_channel!r}")

    def gates_tool(self, tool: str) -> bool:
        """A step of `tool` needs approval (a `tool` glob matches its name)."""
        return any(r.kind == "tool" and fnmatch.fnmatchcase(tool, r.pattern)
                   for r in self.required)

    def gates_channel(self, channel: str) -> bool:
        """An `effect.stage` on `channel` needs approval (the channel is listed)."""
        return any(r.kind == "channel" and r.pattern == channel for r in self.required)


def _requirements(value: object, where: str) -> tuple[Requirement, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{where}: must be a list of {{tool: <glob>}} or "
                         f"{{channel: <name>}}, got {value!r}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or len(item) != 1 or \
                next(iter(item)) not in REQUIREMENT_KINDS:
            raise ValueError(f"{where}[{i}]: must have exactly one of `tool` or `channel`, "
                             f"got {item!r}")
        kind, pattern = next(iter(item.items()))
        try:
            out.append(Requirement(kind, pattern))
        except ValueError as exc:
            raise ValueError(f"{where}[{i}].{exc}") from None
    return tuple(out)


_APPROVAL_SPEC_FIELDS = ("required", "approvers", "timeoutSeconds", "notifyChannel")


def approval_from_spec(doc: object, where: str = "approval") -> ApprovalSettings:
    """`spec.approval` as people write it (the CRD, `AGENTTX_DEFAULT_POLICY__APPROVAL`):
    `{"required": [{"tool": "tickets.*"}, {"channel": "payments"}], "approvers": [...],
    "timeoutSeconds": 86400, "notifyChannel": ""}`; absent fields are unset. Raises
    ValueError naming the field (`approval.required[1]: ...`)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: must be an object, got {doc!r}")
    unknown = sorted(set(doc) - set(_APPROVAL_SPEC_FIELDS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field (known: "
                         f"{', '.join(_APPROVAL_SPEC_FIELDS)})")
    required = _requirements(doc.get("required", []), f"{where}.required")
    approvers = doc.get("approvers")
    if approvers is not None and not isinstance(approvers, list):
        raise ValueError(f"{where}.approvers: must be a list of principals, got "
                         f"{approvers!r}")
    try:
        return ApprovalSettings(
            required=required, approvers=None if approvers is None else tuple(approvers),
            timeout_s=doc.get("timeoutSeconds"), notify_channel=doc.get("notifyChannel"))
    except ValueError as exc:
        raise ValueError(f"{where}.{exc}") from None


def approval_to_spec(a: ApprovalSettings) -> dict[str, Any]:
    """The inverse of `approval_from_spec` (unset fields omitted)."""
    doc: dict[str, Any] = {"required": [r.doc() for r in a.required]}
    if a.approvers is not None:
        doc["approvers"] = list(a.approvers)
    if a.timeout_s is not None:
        doc["timeoutSeconds"] = a.timeout_s
    if a.notify_channel is not None:
        doc["notifyChannel"] = a.notify_channel
    return doc


def resolve_approval(layers: Iterable[ApprovalSettings | None]) -> ApprovalSettings | None:
    """The effective approval of a transaction from its layers, least specific first
    (the default policy, then the matching AgentTxPolicy): the requirements of every
    layer (a layer above never removes one below's), and `approvers`, `timeout_s` and
    `notify_channel` from the most specific layer that sets each. None when nothing is
    required (no step is gated). Every field is set in the result."""
    required: list[Requirement] = []
    approvers: tuple[str, ...] = ()
    timeout_s = APPROVAL_TIMEOUT_DEFAULT_S
    notify = ""
    for layer in layers:
        if layer is None:
            continue
        required.extend(layer.required)
        if layer.approvers is not None:
            approvers = layer.approvers
        if layer.timeout_s is not None:
            timeout_s = layer.timeout_s
        if layer.notify_channel is not None:
            notify = layer.notify_channel
    if not required:
        return None
    return ApprovalSettings(tuple(required), approvers, timeout_s, notify)


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
    approval: ApprovalSettings | None = None  # spec.approval (docs/approvals.md)

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
        if self.approval is not None and not isinstance(self.approval, ApprovalSettings):
            raise ValueError(f"approval must be ApprovalSettings or null, got {self.approval!r}")

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
            approval=None if top.get("approval") is None
            else approval_from_spec(top["approval"], "approval"),
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
    if p.approval is not None:  # absent otherwise: older replicas' bytes stay the same
        doc["approval"] = approval_to_spec(p.approval)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


__all__ = ["APPROVAL_MAX_APPROVERS", "APPROVAL_MAX_REQUIREMENTS", "APPROVAL_PATTERN_MAX_CHARS",
           "APPROVAL_PRINCIPAL_MAX_CHARS", "APPROVAL_TIMEOUT_DEFAULT_S",
           "APPROVAL_TIMEOUT_MAX_S", "APPROVAL_TIMEOUT_MIN_S", "DEPTH_MAX", "DEPTH_MIN",
           "FACTOR_MAX", "FACTOR_MIN", "REQUIREMENT_KINDS", "SERVER_DEFAULT_SOURCE",
           "ApprovalSettings", "PublishedPolicy", "Requirement", "RollbackSettings",
           "approval_from_spec", "approval_to_spec", "parse_published_policy",
           "policy_to_json", "resolve_approval"]
