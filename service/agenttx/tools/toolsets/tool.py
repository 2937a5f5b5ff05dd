"""A toolset's tool behind the ordinary Tool interface (docs/toolsets.md, "The three kinds").

* `read`  (READ_ONLY): `execute` calls the upstream; its output is the step's output.
* `saga`  (SAGA): `execute` records a durable intent (the engine writes it in one CAS:
  what is called, with which arguments and idempotency key, and how to undo it), calls
  the upstream, and returns the output with the compensation resolved from the call's
  arguments and output. `compensate` calls the compensating tool with those arguments.
* `deferred` (EFFECT): `execute` only checks the arguments and stages the call like an
  effect; the outbox makes it after commit (`Toolsets.deliver`).

Every kind checks its arguments against the upstream's `inputSchema` first (schema.py);
nothing reaches the upstream with arguments it would refuse for their shape.

The compensation is plain JSON stored in the step record: the toolset (`<ns>/<name>`),
the upstream tool, its resolved arguments and the idempotency key the call is sent with
(`<tx>/<step>/<attempt>/undo`; the step's own call was `<tx>/<step>/<attempt>`). The
toolset's URL and headers are never in it: they are looked up when the undo runs.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, ClassVar

from ... import failpoints
from ...contracts.outbox import DEFERRED_CHANNEL
from ...contracts.toolsets import ToolSpec, resolve_compensation
from ..base import OutcomeUnknown, RollbackKind, StagingContext, Tool, ToolError, ToolResult
from .schema import is_small
from .upstream import UpstreamError

if TYPE_CHECKING:
    from .registry import Toolsets

KIND_ROLLBACK = {"read": RollbackKind.READ_ONLY, "saga": RollbackKind.SAGA,
                 "deferred": RollbackKind.EFFECT}


class CompensationFailed(ToolError):
    """An undo that did not happen; the message names the compensating tool, its
    resolved arguments and the step's idempotency key, so a person can check."""


class ToolsetTool(Tool):
    """Base of the per-tool classes `make_tool` builds (name and kind are class facts,
    as for every Tool)."""

    fields: ClassVar[Any] = None          # checked against the upstream's inputSchema
    toolset_key: ClassVar[str] = ""
    spec: ClassVar[ToolSpec]
    prefix: ClassVar[str] = ""
    registry: ClassVar[Toolsets]
    # SAGA only: the engine writes a durable intent before the call (ctx.record_intent)
    durable_intent: ClassVar[bool] = False
    description: ClassVar[str] = ""

    # ---- step time ------------------------------------------------------------------

    async def execute(self, args: Any, ctx: Any) -> ToolResult:
        active = self.registry.current(self.toolset_key)
        if active is None:
            raise ToolError(f"function {self.name}() does not exist")
        schema = await active.schema(self.spec.name)
        if is_small(args):
            schema.check(args)
        else:
            await asyncio.to_thread(schema.check, args)
        staging: StagingContext = ctx
        key = f"{staging.tx_id}/{staging.step_id}/{staging.attempt}"
        if self.spec.kind == "deferred":
            staged = staging.stage_deferred(
                DEFERRED_CHANNEL + self.toolset_key,
                {"name": self.name, "tool": self.spec.name, "arguments": args})
            return ToolResult({"deferred": True, "tool": self.name, "idempotency_key": staged})
        if self.spec.kind == "read":
            return ToolResult(await self._call(active, args, key))
        return await self._saga(active, args, key, staging)

    async def _saga(self, active: Any, args: dict[str, Any], key: str,
                    ctx: StagingContext) -> ToolResult:
        comp = self.spec.compensate
        assert comp is not None
        now: dict[str, Any] | None = None
        if comp.from_arguments_only:
            now = self._compensation(comp.arguments, args, {}, key)
        await ctx.record_intent({
            "name": self.name, "toolset": self.toolset_key, "tool": self.spec.name,
            "arguments": args, "key": key, "compensation": now,
            "compensate": {"tool": comp.tool, "arguments": dict(comp.arguments)},
        }, active.toolset.upstream.timeout_s)
        try:
            output = await active.upstream.call(self.spec.name, args, key)
        except UpstreamError as exc:
            if exc.maybe_applied:
                raise OutcomeUnknown(exc.message, category=exc.category) from None
            raise ToolError(exc.message, category=exc.category) from None
        failpoints.hit("toolset.saga.after_call")
        return ToolResult(output, compensation=self._compensation(comp.arguments, args,
                                                                  output, key))

    def _compensation(self, template: Any, args: Any, output: Any, key: str) -> dict[str, Any]:
        comp = self.spec.compensate
        assert comp is not None
        doc: dict[str, Any] = {"toolset": self.toolset_key, "tool": comp.tool,
                               "name": f"{self.prefix}.{comp.tool}", "key": key}
        try:
            doc["arguments"] = resolve_compensation(template, call_arguments=args,
                                                    output=output)
        except KeyError as exc:
            # The step happened; its undo cannot be built. Recorded as such: a rollback
            # that reaches it stops for a person (docs/toolsets.md, MANUAL).
            doc["unresolved"] = f"{exc.args[0]} is not in the step's arguments or output"
        return doc

    async def _call(self, active: Any, args: dict[str, Any], key: str) -> Any:
        try:
            return await active.upstream.call(self.spec.name, args, key)
        except UpstreamError as exc:
            raise ToolError(exc.message, category=exc.category) from None

    # ---- undo -----------------------------------------------------------------------

    async def compensate(self, compensation: Any) -> None:
        await compensate(self.registry, compensation)


async def compensate(registry: Toolsets, doc: Any) -> None:
    """Call the compensating tool a saga step recorded. Idempotent as far as the
    upstream honours the idempotency key (`<step key>/undo`, the same on every try)."""
    if not isinstance(doc, dict) or "toolset" not in doc:
        raise CompensationFailed("the step recorded no compensation")
    what = (f"compensation {doc.get('name') or doc.get('tool')} "
            f"{json.dumps(doc.get('arguments'), ensure_ascii=False, sort_keys=True)} "
            f"(idempotency key {doc.get('key')})")
    if "unresolved" in doc:
        raise CompensationFailed(f"{what} cannot be built: {doc['unresolved']}")
    active = registry.current(str(doc["toolset"]))
    if active is None:
        raise CompensationFailed(f"{what} failed: toolset {doc['toolset']} is not loaded")
    try:
        await active.upstream.call(str(doc["tool"]), doc.get("arguments") or {},
                                   f"{doc['key']}/undo")
    except UpstreamError as exc:
        raise CompensationFailed(f"{what} failed: {exc.message}") from None


def undo_sentence(spec: ToolSpec) -> str:
    """The one sentence ListTools adds to the upstream's description (docs/toolsets.md)."""
    if spec.kind == "read":
        return "A read: it runs at once and changes nothing, so a rollback has nothing to undo."
    if spec.kind == "deferred":
        return ("Runs only when the transaction commits (staged until then); a rollback "
                "discards it.")
    assert spec.compensate is not None
    return (f"Acts at once; if the transaction rolls back, AgentTx undoes it by calling "
            f"{spec.compensate.tool}.")


def make_tool(registry: Toolsets, toolset_key: str, prefix: str,
              spec: ToolSpec) -> ToolsetTool:
    """One Tool class per toolset tool (its name and rollback kind are class facts)."""
    cls = type(f"ToolsetTool_{prefix}_{spec.name}", (ToolsetTool,), {
        "name": f"{prefix}.{spec.name}", "rollback": KIND_ROLLBACK[spec.kind],
        "toolset_key": toolset_key, "spec": spec, "prefix": prefix, "registry": registry,
        "durable_intent": spec.kind == "saga",
        "__doc__": f"{spec.name} from toolset {toolset_key}.",
    })
    return cls()  # type: ignore[no-any-return]


__all__ = ["DEFERRED_CHANNEL", "CompensationFailed", "ToolsetTool", "compensate", "make_tool",
           "undo_sentence"]
