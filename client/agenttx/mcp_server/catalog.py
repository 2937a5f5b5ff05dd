"""Which MCP tools `agenttx mcp` offers, how each is described to a model, and the words
a model reads.

The tool list comes from the service (`ListTools`): built-ins, plug-ins and the toolsets
in the caller's scope, never what happens to be installed where `agenttx mcp` runs. Each
becomes an MCP tool named without dots (`kv.put` -> `kv_put`, `tickets.create_ticket` ->
`tickets_create_ticket`), with the service's description and typed input schema (objects
are `object`, record ids `["string", "number"]`, any-JSON values list every JSON type, so
generic clients send typed values) plus the optional `transaction` handle, an output
schema for the step result it returns as `structuredContent` (`STEP_OUTPUT_SCHEMA`), and
annotations that tell the truth about its kind: `read` tools are read-only; `journal`
writes and staged `effect`s are not destructive (nothing leaves the transaction before
commit); `saga` tools act on the world at once and `deferred` calls run at commit, so
both are destructive (and open-world outside the sandbox). Four control tools drive the
transaction itself.

The service words its hints for gRPC callers (`kv.put it first`, `add it to
arguments_json`, `send a map`); `mcp_text` says the same with the names the model sees
(`kv_put`, `arguments`, `an object`).

Pure: builds `mcp.types.Tool` values and strings, no I/O.
"""

from __future__ import annotations

import logging
import re
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

STEP_NOTE = ("Runs as the next step of your AgentTx transaction (with an MCP session the "
             "first call begins one; without, call agenttx_begin first and pass its handle as "
             "`transaction`); nothing is committed until agenttx_commit. Arguments may use an "
             "earlier step's output as \"${steps.N.field}\".")

STRATEGIES = ["NONE", "LOCAL_BACKTRACK", "DEPENDENCY_JUMP", "GLOBAL_RESET", "MANUAL", "ABORT"]
# What every step tool returns as `structuredContent` (its MCP `outputSchema`).
STEP_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean", "description": "the step applied"},
        "output": {"description": "the tool's output (any JSON; null when the step failed)"},
        "category": {"type": "string",
                     "description": "why it failed (a PostgreSQL condition name); \"\" when ok"},
        "hint": {"type": "string", "description": "what to do about it; \"\" when ok"},
        "strategy": {"type": "string", "enum": STRATEGIES,
                     "description": "how AgentTx recovered (NONE when ok)"},
        "next_step": {"type": "integer", "minimum": 0,
                      "description": "the step sent next; 0 once the transaction ended"},
        "rollback_to_step": {"type": "integer", "minimum": 0,
                             "description": "the first step undone; 0 = the initial state"},
        "transaction": {"type": "string", "description": "the transaction handle"},
        "step_id": {"type": "integer", "description": "this step's number"},
        "constraints": {"type": "array", "items": {"type": "string"},
                        "description": "what failures taught so far; keep respecting them"},
        "context_reset": {"type": "boolean"},
        "abort_reason": {"type": "string"},
        "compensation_errors": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["ok", "output", "category", "hint", "strategy", "next_step",
                 "rollback_to_step"],
}


def mcp_name(agenttx_name: str) -> str:
    return agenttx_name.replace(".", "_")


# gRPC / serde words in the service's texts, and what a model calling MCP tools reads.
_WORDS = (
    (re.compile(r"\barguments_json\b"), "arguments"),
    (re.compile(r"\bsend a map\b"), "send an object"),
    (re.compile(r"\bsend a sequence\b"), "send an array"),
)


def mcp_text(text: str, names: Iterable[str] = ()) -> str:
    """`text` with AgentTx tool names (`kv.put`) as the MCP names the model calls (`kv_put`)
    and gRPC's words as MCP's (`arguments_json` -> `arguments`, `a map` -> `an object`)."""
    for pattern, word in _WORDS:
        text = pattern.sub(word, text)
    dotted = sorted((n for n in names if "." in n), key=len, reverse=True)
    if dotted:
        tools = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in dotted) + r")(?![\w])")
        text = tools.sub(lambda m: mcp_name(m.group(1)), text)
    return text


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
                        "agenttx_commit or agenttx_rollback (closing the session rolls it "
                        "back). Returns the transaction handle: when your client keeps no "
                        "session, pass it as `transaction` to every other tool.",
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
                           output_schema=STEP_OUTPUT_SCHEMA,
                           annotations=_annotations(info)),
                info.name, handle)
        self.control = {t.name: t for t in _control_tools()}
        self.names = frozenset(e.agenttx_name for e in self.entries.values())

    def text(self, text: str) -> str:
        """`mcp_text` with this catalog's tool names."""
        return mcp_text(text, self.names)

    def tools(self) -> list[types.Tool]:
        return [e.tool for e in self.entries.values()] + list(self.control.values())

    def input_schema(self, name: str) -> dict[str, Any] | None:
        if name in self.entries:
            return self.entries[name].tool.input_schema
        tool = self.control.get(name)
        return tool.input_schema if tool else None
