"""How each tool is described to callers (`ListTools`): name, description, input schema
and kind.

Why here and not in the MCP server: the client distribution must not know which tools
are installed beside it; it asks the service (`ListTools`) and shows what the service
will run. So the words a model reads about a built-in, and the truth about how each tool
is undone, live with the tools.

Kinds (docs/api.md, ListTools): `journal` (buffered until commit, dropped on rollback),
`saga` (acts at once, undone by a compensation), `effect` (staged, sent after commit),
`read`; toolsets add `deferred` (called after commit).

Pure: no I/O.
"""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import dataclass

from .base import RollbackKind, Tool
from .registry import ToolRegistry
from .schema import input_schema

KIND_NAMES = {RollbackKind.JOURNAL: "journal", RollbackKind.SAGA: "saga",
              RollbackKind.EFFECT: "effect", RollbackKind.READ_ONLY: "read"}

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


@dataclass(frozen=True)
class ToolDescription:
    name: str
    description: str
    input_schema_json: str
    kind: str
    toolset: str = ""          # "<namespace>/<name>"; "" for built-ins and plug-ins


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


def describe(tool: Tool) -> ToolDescription:
    """A tool as ListTools shows it. The schema is the argument model's, with real JSON
    types (objects are `object`, ids `["string", "number"]`, any value every JSON type),
    so generic clients send typed values."""
    schema = input_schema(tool.fields, references=False)
    return ToolDescription(tool.name, _description(tool),
                           json.dumps(schema, separators=(",", ":"), sort_keys=True),
                           KIND_NAMES[tool.rollback])


def describe_all(registry: ToolRegistry) -> list[ToolDescription]:
    out = []
    for name in registry.names():
        tool = registry.get(name)
        assert tool is not None
        out.append(describe(tool))
    return out


__all__ = ["BUILTIN_DESCRIPTIONS", "KIND_NAMES", "ToolDescription", "describe",
           "describe_all"]
