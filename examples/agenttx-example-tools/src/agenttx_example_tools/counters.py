"""`counter.add`: a JOURNAL tool. It adds to an integer kept under a kv key.

A JOURNAL tool never writes anything itself: it reads and writes through the step
context (`ctx.kv_get` / `ctx.kv_put`), which sees committed data plus the transaction's
own live writes and buffers this step's writes. The engine stores them with the step,
applies them at commit in one compare-and-swap, and on rollback simply drops them, so
there is nothing to compensate. Because the context records which keys a step touched,
a failure here is traced to the live step that last wrote the key
(docs/recovery.md#3-dependencies-and-provenance): if the counter holds text, an exhausted retry
budget jumps back to the step that wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from agenttx.tools.base import RollbackKind, Tool, ToolArguments, ToolContext, ToolError, ToolResult


class CounterArguments(ToolArguments):
    key: str = Field(min_length=1, max_length=512)
    amount: int = 1


class AddToCounter(Tool):
    name = "counter.add"
    description = "Add `amount` (default 1) to the integer counter kept under a kv key."
    fields = CounterArguments
    rollback = RollbackKind.JOURNAL

    def prefetch(self, args: Mapping[str, Any]) -> Sequence[tuple[str, Any]]:
        # Optional: name the kv key up front so the engine reads it in the step's first
        # etcd round trip. Only for a literal key; a `${steps…}` reference is resolved later.
        key = args.get("key")
        return [("kv", key)] if isinstance(key, str) and "${steps." not in key else []

    async def execute(self, args: CounterArguments, ctx: ToolContext) -> ToolResult:
        found, current = await ctx.kv_get(args.key)
        if not found:
            current = 0
        if isinstance(current, bool) or not isinstance(current, int):
            shown = current if isinstance(current, str) else json.dumps(current)
            # PostgreSQL's wording for `'many'::integer`; the cleaner names the value.
            raise ToolError(f'invalid input syntax for type integer: "{shown}"', argument="key",
                            data=f"kv:{args.key}")
        value = current + args.amount
        await ctx.kv_put(args.key, value)
        return ToolResult({"key": args.key, "value": value, "previous": current})
