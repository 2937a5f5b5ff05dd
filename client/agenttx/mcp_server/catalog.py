"""Which MCP tools `agenttx mcp` offers and how each is described to a model.

The tool list comes from the service (`ListTools`): built-ins, plug-ins and the toolsets
in the caller's scope, never what happens to be installed where `agenttx mcp` runs. Each
becomes an MCP tool named without dots (`kv.put` -> `kv_put`, `tickets.create_ticket` ->
`tickets_create_ticket`), with the service's description and input schema plus the
optional `transaction` handle, and annotations that tell the truth about its kind:
`read` tools are read-only; `journal` writes and staged `effect`s are not destructive
(nothing leaves the transaction before commit); `saga` tools act on the world at once and
`deferred` calls run at commit, so both are destructive (and open-world outside the
sandbox). Four control tools drive the transaction itself.

Pure: builds `mcp.types.Tool` values, no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mcp import types

from ..client import ToolInfo

log = logging.getLogger(__name__)

HANDLE = "transaction"
# Used instead of HANDLE for a plug-in whose own arguments already have a `transaction`.
HANDLE_FALLBACK = "agenttx_transaction"
HANDLE_SCHEMA = {
    "type": "string",
    "description": "the transaction handle agenttx_begin returned; only needed when your "
                   "MCP client keeps no session (otherwise the server tracks it for you)",
}

BEGIN, COMMIT, ROLLBACK, STATUS = "agenttx_begin", "agenttx_commit", "agenttx_rollback", \
    "agenttx_status"
CONTROL_TOOLS = (BEGIN, COMMIT, ROLLBACK, STATUS)

STEP_NOTE = ("Runs as the next step of your AgentTx transaction (the first call begins one); "
             "nothing is committed until agenttx_commit. Arguments may use an earlier step's "
             "output as \"${steps.N.field}\".")


def mcp_name(agenttx_name: str) -> str:
    return agenttx_name.replace(".", "_")


def _annotations(info: ToolInfo) -> types.ToolAnnotations:
    kind, builtin = info.kind, not info.toolset
    if kind == "read":
        return types.ToolAnnotations(title=info.name, read_only_hint=True,
                                     open_world_hint=not builtin)
    if kind == "journal":
        return types.ToolAnnotations(title=info.name, read_only_hint=False,
                                     destructive_hint=False, idempotent_hint=False,
                                     open_world_hint=False)
    if kind == "effect":
        return types.ToolAnnotations(title=info.name, read_only_hint=False,
                                     destructive_hint=False, idempotent_hint=False,
                                     open_world_hint=True)
    # saga (acts now: fs.write overwrites a sandbox file, a toolset calls its upstream) and
    # deferred (acts at commit, outside AgentTx)
    return types.ToolAnnotations(title=info.name, read_only_hint=False, destructive_hint=True,
                                 idempotent_hint=False,
                                 open_world_hint=kind == "deferred" or not builtin)


@dataclass(frozen=True)
class Entry:
    """One AgentTx tool as offered over MCP."""

    tool: types.Tool
    agenttx_name: str
    handle: str  # the argument that carries the transaction handle


def _with_handle(schema: dict[str, Any], handle: str) -> dict[str, Any]:
    out = dict(schema)
    out["properties"] = {**schema.get("properties", {}), handle: HANDLE_SCHEMA}
    return out


def _control_tools() -> list[types.Tool]:
    handle_only = {"type": "object", "properties": {HANDLE: HANDLE_SCHEMA},
                   "additionalProperties": False}
    return [
        types.Tool(
            name=BEGIN, title="Begin a transaction",
            description="Begin a new AgentTx transaction. With an MCP session the server "
                        "keeps it for you and every tool call runs as its next step until "
                        "agenttx_commit or agenttx_rollback. Returns the transaction handle "
                        "(pass it as `transaction` when your client keeps no session).",
            input_schema={"type": "object", "properties": {}, "additionalProperties": False},
            annotations=types.ToolAnnotations(title="Begin a transaction", read_only_hint=False,
                                              destructive_hint=False, idempotent_hint=False,
                                              open_world_hint=False)),
        types.Tool(
            name=COMMIT, title="Commit the transaction",
            description="Commit every step of the transaction at once: writes are applied "
                        "atomically and staged effects are sent. If another transaction "
                        "changed the same data first, everything is undone and the "
                        "transaction ends: begin again and redo the work.",
            input_schema=handle_only,
            annotations=types.ToolAnnotations(title="Commit the transaction",
                                              read_only_hint=False, destructive_hint=True,
                                              idempotent_hint=False, open_world_hint=True)),
        types.Tool(
            name=ROLLBACK, title="Roll back the transaction",
            description="Undo the transaction: everything (it ends), or with to_step=K only "
                        "the steps from K on (it stays open and continues at step K). Also "
                        "resolves a transaction waiting for a manual rollback.",
            input_schema={"type": "object", "properties": {
                HANDLE: HANDLE_SCHEMA,
                "to_step": {"type": "integer", "minimum": 1,
                            "description": "undo steps >= to_step only; omit to abort"},
            }, "additionalProperties": False},
            annotations=types.ToolAnnotations(title="Roll back the transaction",
                                              read_only_hint=False, destructive_hint=True,
                                              idempotent_hint=False, open_world_hint=False)),
        types.Tool(
            name=STATUS, title="Transaction status",
            description="Show the open transaction: status, the next step, the constraints "
                        "learned from failed steps (keep respecting them) and the context "
                        "log.",
            input_schema=handle_only,
            annotations=types.ToolAnnotations(title="Transaction status", read_only_hint=True,
                                              open_world_hint=False)),
    ]


class Catalog:
    """The MCP tool list, built from what the service's ListTools returned."""

    def __init__(self, infos: Iterable[ToolInfo]) -> None:
        self.entries: dict[str, Entry] = {}
        for info in sorted(infos, key=lambda i: i.name):
            exposed = mcp_name(info.name)
            if exposed in self.entries or exposed in CONTROL_TOOLS:
                log.error("skipping tool: its MCP name is taken",
                          extra={"tool": info.name, "mcp_name": exposed})
                continue
            schema = dict(info.input_schema) or {"type": "object"}
            handle = HANDLE if HANDLE not in schema.get("properties", {}) else HANDLE_FALLBACK
            self.entries[exposed] = Entry(
                types.Tool(name=exposed, title=info.name,
                           description=f"{info.description} {STEP_NOTE}",
                           input_schema=_with_handle(schema, handle),
                           annotations=_annotations(info)),
                info.name, handle)
        self.control = {t.name: t for t in _control_tools()}

    def tools(self) -> list[types.Tool]:
        return [e.tool for e in self.entries.values()] + list(self.control.values())

    def input_schema(self, name: str) -> dict[str, Any] | None:
        if name in self.entries:
            return self.entries[name].tool.input_schema
        tool = self.control.get(name)
        return tool.input_schema if tool else None
