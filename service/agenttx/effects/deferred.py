"""Deferred toolset calls ride the effects outbox (docs/toolsets.md, "deferred").

A `deferred` toolset tool stages its call like an effect, on the toolset's own channel
`toolset:<ns>/<name>` (no configured channel can be named so, and `effect.stage` cannot
name it). At commit it enters the outbox in the same etcd transaction as the data and is
delivered by the same dispatcher, at-least-once with its staged idempotency key, and
never if the transaction does not commit. This module is the one place that tells the
two apart: `Channels` answers for the configured channels and routes toolset channels to
`Toolsets.deliver` (an MCP `tools/call` whose `_meta` carries the key).

A refusal the upstream means (`isError`, a JSON-RPC error, HTTP 4xx other than 408 and
429) is permanent: `PermanentDeliveryError` (a dead letter, once the outbox moves those
aside; docs/operations.md); anything else (cannot connect, timeout, 5xx) is retried.
"""

from __future__ import annotations

from typing import Any

from ..tools.toolsets import DEFERRED_CHANNEL, Toolsets, UpstreamError
from .channels import ChannelRegistry, DeliveryError, Effect


class PermanentDeliveryError(DeliveryError):
    """The receiver refused the delivery for good: retrying the same call cannot help."""


class Channels(ChannelRegistry):
    """The dispatcher's view of where effects go: the configured channels (`names()` is
    theirs only, so `effect.stage` offers nothing else) plus the toolsets' deferred
    calls."""

    def __init__(self, channels: ChannelRegistry, toolsets: Toolsets) -> None:
        super().__init__({name: cfg for name in channels.names()
                          if (cfg := channels.get(name)) is not None})
        self.toolsets = toolsets

    def has(self, name: str) -> bool:
        return super().has(name) or (
            name.startswith(DEFERRED_CHANNEL)
            and self.toolsets.current(name[len(DEFERRED_CHANNEL):]) is not None)

    async def deliver(self, effect: Effect) -> None:
        if not effect.channel.startswith(DEFERRED_CHANNEL):
            await super().deliver(effect)
            return
        toolset = effect.channel[len(DEFERRED_CHANNEL):]
        try:
            await self.toolsets.deliver(toolset, effect.payload, effect.idempotency_key)
        except UpstreamError as exc:
            error = PermanentDeliveryError if exc.permanent else DeliveryError
            raise error(f"{_name(effect.payload)}: {exc.message}") from None


def _name(payload: Any) -> str:
    return str(payload.get("name")) if isinstance(payload, dict) else "deferred call"


__all__ = ["Channels", "PermanentDeliveryError"]
