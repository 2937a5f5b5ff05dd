"""Which rollback policy applies, and the result (docs/architecture.md, "Policies").

A transaction's effective policy is resolved once, at begin: server defaults, overlaid
with the set fields of the most specific matching `AgentTxPolicy`, overlaid with the
fields set in the request's `policy`. Approvals combine differently (docs/approvals.md):
the requirements of the default policy and of the matching AgentTxPolicy add up (a layer
never removes one below's, and a request cannot touch them at all), while approvers,
timeout and notify channel come from the most specific layer that sets each. Pure
functions over plain data; the published record and its ranges live in
`agenttx.contracts.policy` (shared with the operator). It never reads etcd or the
Kubernetes API itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..contracts.policy import (
    DEPTH_MAX,
    DEPTH_MIN,
    FACTOR_MAX,
    FACTOR_MIN,
    SERVER_DEFAULT_SOURCE,
    ApprovalSettings,
    PublishedPolicy,
    RollbackSettings,
    parse_published_policy,
    policy_to_json,
    resolve_approval,
)

__all__ = ["ApprovalSettings", "DEPTH_MAX", "DEPTH_MIN", "FACTOR_MAX", "FACTOR_MIN", "SERVER_DEFAULT_SOURCE",
           "EffectivePolicy", "PublishedPolicy", "RollbackSettings", "matches",
           "parse_published_policy", "policy_to_json", "resolve_policy", "select_policy"]


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
    approval: ApprovalSettings | None = None  # every field set; None: nothing is gated


def resolve_policy(
    *,
    defaults: RollbackSettings,
    default_idle_timeout_s: int,
    published: PublishedPolicy | None,
    request_max_local_depth: int | None,
    request_max_global_resets: int | None,
    request_replay_budget_factor: float | None,
    default_approval: ApprovalSettings | None = None,
) -> EffectivePolicy:
    """Layer server defaults <- published policy's set fields <- request's set fields.

    Each field is taken independently from the highest layer that sets it. `source`
    names the published policy even when the request overrides some of its fields.
    The approval is `resolve_approval([default_approval, published.approval])`: the
    request has no say in it. Raises ValueError if a request value is out of range.
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
        approval=resolve_approval(
            [default_approval, published.approval if published is not None else None]),
    )
