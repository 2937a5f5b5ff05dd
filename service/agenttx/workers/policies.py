"""The published AgentTxPolicy set, kept current by watching `<prefix>/policies/`.

Why a watch and not a read per BeginTransaction: begin must cost one etcd round trip,
and service pods need no Kubernetes API access — the operator publishes, we listen.
A malformed published policy is logged and ignored, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
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
from ..store.client import Store, op_get_prefix

log = logging.getLogger(__name__)


class PolicyCache:
    def __init__(self, store: Store, keys: Keys, defaults: RollbackSettings,
                 default_idle_timeout_s: int, service_namespace: str = "", *,
                 default_approval: ApprovalSettings | None = None) -> None:
        self.store = store
        self.default_approval = default_approval
        self.keys = keys
        self.defaults = defaults
        self.default_idle_timeout_s = default_idle_timeout_s
        self.service_namespace = service_namespace
        self.policies: dict[bytes, PublishedPolicy] = {}
        self.revision = 0
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

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

    async def load(self) -> None:
        prefix = self.keys.policies_prefix()
        res = await self.store.read([op_get_prefix(prefix)], what="policy load")
        self.policies.clear()
        for kv in res.kvs(0):
            self._apply(kv.key, kv.value)
        self.revision = res.revision
        self.ready.set()

    async def _watch(self) -> None:
        prefix = self.keys.policies_prefix()
        backoff = 0.5
        while True:
            try:
                if not self.ready.is_set():
                    await self.load()
                await self.store.client.connect()
                watch = await self.store.client.watch_prefix(
                    prefix, start_revision=self.revision + 1)
                backoff = 0.5
                async for event in watch:
                    kv = event.kv
                    deleted = str(getattr(event, "kind", "")).upper().endswith("DELETE")
                    self._apply(bytes(kv.key), None if deleted else bytes(kv.value))
                    self.revision = max(self.revision, int(kv.mod_revision))
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being stopped
                # aetcd cancels its own stream reader when a channel goes away; that is
                # an interrupted watch, not a reason to stop watching.
                log.warning("policy watch stream cancelled; reloading")
                self.ready.clear()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception as exc:
                log.warning("policy watch interrupted; reloading",
                            extra={"error": f"{type(exc).__name__}: {exc}"})
                self.ready.clear()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

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

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="policy-watch")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

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
