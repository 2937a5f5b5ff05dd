"""The published AgentTxPolicy set, kept current by watching `<prefix>/policies/`.

Why a watch and not a read per BeginTransaction: begin must cost one etcd round trip,
and service pods need no Kubernetes API access — the operator publishes, we listen
(through the store's one watch loop, `agenttx.store.watch`).
A malformed published policy is logged and ignored, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..contracts.layout import Keys
from ..engine.model import ANONYMOUS, Caller
from ..engine.policy import (
    ApprovalSettings,
    EffectivePolicy,
    PublishedPolicy,
    RollbackSettings,
    parse_published_policy,
    resolve_policy,
    select_policy,
)
from ..store.client import Store
from ..store.ops import KeyValue, WatchEvent
from ..store.watch import Watch

log = logging.getLogger(__name__)


class PolicyCache(Watch):
    def __init__(self, store: Store, keys: Keys, defaults: RollbackSettings,
                 default_idle_timeout_s: int, service_namespace: str = "", *,
                 default_approval: ApprovalSettings | None = None) -> None:
        super().__init__(store, keys.policies_prefix(), prefix=True, what="policy")
        self.default_approval = default_approval
        self.keys = keys
        self.defaults = defaults
        self.default_idle_timeout_s = default_idle_timeout_s
        self.service_namespace = service_namespace
        self.policies: dict[bytes, PublishedPolicy] = {}

    def on_snapshot(self, kvs: Sequence[KeyValue], revision: int) -> None:
        self.policies.clear()
        for kv in kvs:
            self._apply(kv.key, kv.value)

    def on_event(self, event: WatchEvent) -> None:
        self._apply(event.key, event.value)

    def _apply(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            if self.policies.pop(key, None) is not None:
                log.info("policy removed", extra={"key": key.decode()})
            return
        try:
            self.policies[key] = parse_published_policy(value)
            log.info("policy loaded", extra={"key": key.decode(),
                                             "generation": self.policies[key].generation})
        except ValueError as exc:
            self.policies.pop(key, None)
            log.error("ignoring malformed policy", extra={"key": key.decode(), "error": str(exc)})

    def in_scope(self, caller: Caller) -> list[PublishedPolicy]:
        """SPEC §9 policy scope: with authentication on, a principal gets the policies
        (and sandboxes) of its own namespace plus the service namespace's, never another
        namespace's, whatever agent_id it chooses. Without authentication: all."""
        if not caller.authenticated:
            return list(self.policies.values())
        allowed = {self.service_namespace} if self.service_namespace else set()
        if caller.namespace:
            allowed.add(caller.namespace)
        return [p for p in self.policies.values() if p.namespace in allowed]

    def sandbox_roots(self) -> list[str]:
        return [p.sandbox_path for p in self.policies.values() if p.sandbox_path]

    def resolve(self, agent_id: str, metadata: Mapping[str, str],
                overrides: dict[str, Any], caller: Caller = ANONYMOUS) -> EffectivePolicy:
        chosen = select_policy(self.in_scope(caller), agent_id, metadata)
        return resolve_policy(
            defaults=self.defaults, default_idle_timeout_s=self.default_idle_timeout_s,
            published=chosen,
            request_max_local_depth=overrides.get("max_local_depth"),
            request_max_global_resets=overrides.get("max_global_resets"),
            request_replay_budget_factor=overrides.get("replay_budget_factor"),
            default_approval=self.default_approval)
