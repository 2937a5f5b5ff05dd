"""`notify.team`: an EFFECT tool. It stages a message for a team; nothing is sent yet.

An EFFECT tool must not talk to the outside world in `execute`. It stages the effect with
`ctx.stage_effect(channel, payload, idempotency_key)`; at commit AgentTx moves it into a
durable outbox in the same etcd transaction as the data and delivers it at least once
with its idempotency key. A rolled-back or aborted step's effect is discarded, never
sent. An unknown channel fails the step (`undefined_object`, with the configured names).
"""

from __future__ import annotations

from pydantic import Field

from agenttx.tools.base import RollbackKind, Tool, ToolArguments, ToolContext, ToolResult


class NotifyArguments(ToolArguments):
    team: str = Field(pattern=r"^[a-z0-9-]{1,64}$")
    message: str = Field(min_length=1, max_length=2000)
    channel: str = "log"  # any channel configured with AGENTTX_EFFECT_CHANNELS


class NotifyTeam(Tool):
    name = "notify.team"
    description = "Send a message to a team's channel once the transaction commits."
    fields = NotifyArguments
    rollback = RollbackKind.EFFECT

    async def execute(self, args: NotifyArguments, ctx: ToolContext) -> ToolResult:
        key = ctx.stage_effect(args.channel, {"team": args.team, "message": args.message}, None)
        return ToolResult({"staged": True, "team": args.team, "channel": args.channel,
                           "idempotency_key": key})
