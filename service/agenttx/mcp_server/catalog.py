"""Which MCP tools `agenttx mcp` offers and how each is described to a model.

Every AgentTx tool (built-ins and installed plug-ins, `ToolRegistry.load()`) becomes an
MCP tool named without dots (`kv.put` -> `kv_put`, SPEC §10.1), with the input schema of
its argument model (`tools.schema`) plus the optional `transaction` handle, and
annotations that tell the truth about its rollback kind: read-only tools say so, staged
writes and effects are not destructive (nothing leaves the transaction before commit),
saga tools act on the world at once. Four control tools drive the transaction itself.

Pure: builds `mcp.types.Tool` values, no I/O.
"""

from __future__ import annotations

import inspect
import logging
import sys
from dataclasses import dataclass
from typing import Any

from mcp import types

from ..tools.base import RollbackKind, Tool
from ..tools.registry import ToolRegistry
from ..tools.schema import input_schema

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

BUILTIN_DESCRIPTIONS = {
    "kv.put": "Store a JSON value under a key. Staged: only this transaction sees it until "
              "commit; undone on rollback. Output {key, value}.",
    "kv.get": "Read the value under a key (committed data plus this transaction's writes). "
              "A missing key fails with no_data_found. Output {key, value}.",
    "kv.delete": "Delete a key. Staged until commit; undone on rollback. Deleting a missing "
                 "key is not an error. Output {key, deleted}.",
    "record.insert": "Insert a row into a table, enforcing its primary key `id` and the "
                     "foreign keys named in `references` ({field: referenced_table}). Staged "
                     "until commit; undone on rollback. Output {table, id, fields}.",
    "record.get": "Read a row by table and id. A missing row fails with no_data_found. "
                  "Output {table, id, fields}.",
    "fs.write": "Write a UTF-8 file in the sandbox (relative path, no ..). Takes effect on "
                "disk at once; a rollback restores the previous contents or deletes the "
                "file. Output {path, bytes}.",
    "fs.read": "Read a UTF-8 file in the sandbox. Output {path, contents}.",
    "effect.stage": "Stage a side effect (webhook, email, log) on a configured channel. "
                    "Nothing is sent until the transaction commits; a rollback discards it. "
                    "Output {staged, channel, idempotency_key}.",
}

_KIND_NOTES = {
    RollbackKind.READ_ONLY: "Read-only.",
    RollbackKind.JOURNAL: "Staged until commit; undone on rollback.",
    RollbackKind.SAGA: "Acts at once; undone by its compensation on rollback.",
    RollbackKind.EFFECT: "Staged: nothing is sent until commit; a rollback discards it.",
}


def mcp_name(agenttx_name: str) -> str:
    return agenttx_name.replace(".", "_")


def _description(tool: Tool) -> str:
    if tool.name in BUILTIN_DESCRIPTIONS:
        return BUILTIN_DESCRIPTIONS[tool.name]
    text = getattr(tool, "description", None) or type(tool).__dict__.get("__doc__")
    if not text:
        module = sys.modules.get(type(tool).__module__)
        text = getattr(module, "__doc__", None)
    first = inspect.cleandoc(text).split("\n\n", 1)[0].replace("\n", " ") if text else \
        f"The {tool.name} tool."
    return f"{first} {_KIND_NOTES[tool.rollback]}"


def _annotations(tool: Tool, builtin: bool) -> types.ToolAnnotations:
    kind = tool.rollback
    if kind is RollbackKind.READ_ONLY:
        return types.ToolAnnotations(title=tool.name, read_only_hint=True,
                                     open_world_hint=False if builtin else None)
    if kind is RollbackKind.JOURNAL:
        return types.ToolAnnotations(title=tool.name, read_only_hint=False,
                                     destructive_hint=False, idempotent_hint=False,
                                     open_world_hint=False)
    if kind is RollbackKind.EFFECT:
        return types.ToolAnnotations(title=tool.name, read_only_hint=False,
                                     destructive_hint=False, idempotent_hint=False,
                                     open_world_hint=True)
    # SAGA: changes the world now (fs.write overwrites a file in the sandbox).
    return types.ToolAnnotations(title=tool.name, read_only_hint=False, destructive_hint=True,
                                 idempotent_hint=False,
                                 open_world_hint=False if builtin else None)


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
    """The MCP tool list, built once at start-up from the tool registry."""

    def __init__(self, registry: ToolRegistry) -> None:
        self.entries: dict[str, Entry] = {}
        builtins = set(BUILTIN_DESCRIPTIONS)
        for name in registry.names():
            tool = registry.get(name)
            assert tool is not None
            exposed = mcp_name(name)
            if exposed in self.entries or exposed in CONTROL_TOOLS:
                log.error("skipping tool: its MCP name is taken",
                          extra={"tool": name, "mcp_name": exposed})
                continue
            schema = input_schema(tool.fields)
            handle = HANDLE if HANDLE not in schema.get("properties", {}) else HANDLE_FALLBACK
            self.entries[exposed] = Entry(
                types.Tool(name=exposed, title=name,
                           description=f"{_description(tool)} {STEP_NOTE}",
                           input_schema=_with_handle(schema, handle),
                           annotations=_annotations(tool, name in builtins)),
                name, handle)
        self.control = {t.name: t for t in _control_tools()}

    def tools(self) -> list[types.Tool]:
        return [e.tool for e in self.entries.values()] + list(self.control.values())

    def input_schema(self, name: str) -> dict[str, Any] | None:
        if name in self.entries:
            return self.entries[name].tool.input_schema
        tool = self.control.get(name)
        return tool.input_schema if tool else None
