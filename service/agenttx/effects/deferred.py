"""Deferred toolset calls ride the effects outbox (docs/toolsets.md, "deferred").

A `deferred` toolset tool stages its call at step time like an effect; at commit it
becomes a `deferred` outbox entry (contracts.outbox) in the same etcd transaction as the
data, and the dispatcher delivers it like any entry — during the commit call, then in
the background with backoff — at least once with its staged idempotency key, and never
if the transaction does not commit. This module is that delivery: an MCP `tools/call`
on the toolset's upstream (`Toolsets.deliver`).

A refusal the upstream means (`isError`, a JSON-RPC error, HTTP 4xx other than 408 and
429) is permanent, so the dispatcher moves the entry to the dead letters instead of
retrying it; anything else (cannot connect, timeout, 5xx, a toolset this replica does
not serve right now) is retried.
"""

from __future__ import annotations

from ..contracts.outbox import OutboxEntry
from ..tools.toolsets import Toolsets, UpstreamError
from .delivery import DeliveryError
from .outbox import DeferredDelivery


def deferred_delivery(toolsets: Toolsets) -> DeferredDelivery:
    """The dispatcher's delivery for `deferred` entries."""

    async def deliver(entry: OutboxEntry) -> None:
        # `tool` is the AgentTx name, `<prefix>.<upstream tool>`; a prefix has no dot
        upstream_tool = entry.tool.split(".", 1)[1] if "." in entry.tool else entry.tool
        try:
            await toolsets.deliver(entry.toolset, upstream_tool, entry.arguments,
                                   entry.idempotency_key)
        except UpstreamError as exc:
            raise DeliveryError(exc.message, permanent=exc.permanent) from None

    return deliver


__all__ = ["deferred_delivery"]
