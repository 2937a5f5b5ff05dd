"""The eight built-in tools (seed 000, SPEC §3).

They are production primitives and the reference for users' own tools: each one
validates its arguments serde-style, reads through the step context (committed data
plus the transaction's live writes), and fails with the message a real system would
give (PostgreSQL, POSIX, serde), so the error cleaner can produce a precise hint.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ..args.jsonargs import describe
from ..args.refs import has_reference
from .base import (
    INVALID_PARAMETER_VALUE,
    NO_DATA_FOUND,
    ArgType,
    Field,
    FsContext,
    RollbackKind,
    Tool,
    ToolContext,
    ToolError,
    ToolResult,
)

TABLE_NAME = re.compile(r"[A-Za-z0-9_]{1,128}")
# Foreign keys on one row. Each referenced row is read in the step's first etcd round
# trip, which etcd caps at --max-txn-ops operations (default 128 upstream); more than
# this is refused with program_limit_exceeded instead of failing the read.
MAX_REFERENCES = 64


def pg_value(value: Any) -> str:
    """How PostgreSQL prints a key value in DETAIL lines: text as-is, numbers as JSON."""
    return value if isinstance(value, str) else str(value)


def check_table(table: str, argument: str) -> None:
    if not TABLE_NAME.fullmatch(table):
        raise ToolError(
            f'invalid name syntax: table "{table}" must match [A-Za-z0-9_]{{1,128}}',
            argument=argument, category="invalid_name")


def _literal(value: Any) -> bool:
    return not has_reference(value)


class KvPut(Tool):
    name = "kv.put"
    fields = (Field("key", ArgType.STRING), Field("value", ArgType.ANY, required=False))
    rollback = RollbackKind.JOURNAL

    def prefetch(self, args: Mapping[str, Any]) -> Sequence[tuple[str, Any]]:
        key = args.get("key")
        return [("kv", key)] if isinstance(key, str) and _literal(key) else []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await ctx.kv_put(args["key"], args["value"])
        return ToolResult({"key": args["key"], "value": args["value"]})


class KvGet(Tool):
    name = "kv.get"
    fields = (Field("key", ArgType.STRING),)
    rollback = RollbackKind.READ_ONLY
    prefetch = KvPut.prefetch

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        found, value = await ctx.kv_get(args["key"])
        if not found:
            raise ToolError(f'no row with key={args["key"]} in table "kv"', argument="key",
                            data=f"kv:{args['key']}", category=NO_DATA_FOUND)
        return ToolResult({"key": args["key"], "value": value})


class KvDelete(Tool):
    name = "kv.delete"
    fields = (Field("key", ArgType.STRING),)
    rollback = RollbackKind.JOURNAL
    prefetch = KvPut.prefetch

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        deleted = await ctx.kv_delete(args["key"])
        return ToolResult({"key": args["key"], "deleted": deleted})


def _record_prefetch(args: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    table, rid = args.get("table"), args.get("id")
    if isinstance(table, str) and _literal(table) and isinstance(rid, str | int | float) \
            and not isinstance(rid, bool) and _literal(rid):
        out.append(("rec", (table, rid)))
    refs, fields = args.get("references"), args.get("fields")
    if isinstance(refs, dict) and isinstance(fields, dict) and len(refs) <= MAX_REFERENCES:
        for f, ref_table in refs.items():
            v = fields.get(f)
            if isinstance(ref_table, str) and _literal(ref_table) and \
                    isinstance(v, str | int | float) and not isinstance(v, bool) and _literal(v):
                out.append(("rec", (ref_table, v)))
    return out


class RecordInsert(Tool):
    name = "record.insert"
    fields = (
        Field("table", ArgType.STRING),
        Field("id", ArgType.ID),
        Field("fields", ArgType.OBJECT, required=False, default=None),
        Field("references", ArgType.OBJECT, required=False, default=None),
    )
    rollback = RollbackKind.JOURNAL

    def prefetch(self, args: Mapping[str, Any]) -> Sequence[tuple[str, Any]]:
        return _record_prefetch(args)

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        table, rid = args["table"], args["id"]
        fields = args["fields"] or {}
        references = args["references"] or {}
        check_table(table, "table")
        if len(references) > MAX_REFERENCES:
            raise ToolError(f"program limit exceeded: {len(references)} references on one row "
                            f"of table \"{table}\"; the limit is {MAX_REFERENCES}",
                            argument="references", category="program_limit_exceeded")
        for f, ref_table in references.items():
            if not isinstance(ref_table, str):
                # "<argument>: " names the argument in the hint (serde_path_to_error style)
                raise ToolError(f"references.{f}: invalid type: {describe(ref_table)}, "
                                "expected a string", argument=f"references.{f}",
                                category=INVALID_PARAMETER_VALUE)
            check_table(ref_table, f"references.{f}")
        # PostgreSQL's order: NOT NULL, then the primary key, then foreign keys.
        for f in references:
            if fields.get(f) is None:
                raise ToolError(
                    f'null value in column "{f}" of relation "{table}" violates not-null '
                    "constraint", argument=f"fields.{f}",
                    category="not_null_violation")
        if await ctx.record_get(table, rid) is not None:
            raise ToolError(
                f'duplicate key value violates unique constraint "{table}_pkey"\n'
                f"DETAIL:  Key (id)=({pg_value(rid)}) already exists.", argument="id",
                category="unique_violation")
        for f, ref_table in references.items():
            value = fields[f]
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise ToolError(f"fields.{f}: invalid type: {describe(value)}, expected a "
                                "string or number", argument=f"fields.{f}",
                                category=INVALID_PARAMETER_VALUE)
            if await ctx.record_get(ref_table, value) is None:
                raise ToolError(
                    f'insert or update on table "{table}" violates foreign key constraint '
                    f'"{table}_{f}_fkey"\nDETAIL:  Key ({f})=({pg_value(value)}) is not '
                    f'present in table "{ref_table}".', argument=f"fields.{f}",
                    category="foreign_key_violation")
        await ctx.record_insert(table, rid, fields)
        return ToolResult({"table": table, "id": rid, "fields": fields})


class RecordGet(Tool):
    name = "record.get"
    fields = (Field("table", ArgType.STRING), Field("id", ArgType.ID))
    rollback = RollbackKind.READ_ONLY

    def prefetch(self, args: Mapping[str, Any]) -> Sequence[tuple[str, Any]]:
        return _record_prefetch(args)

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        table, rid = args["table"], args["id"]
        check_table(table, "table")
        row = await ctx.record_get(table, rid)
        if row is None:
            raise ToolError(f'no row with id={pg_value(rid)} in table "{table}"', argument="id",
                            category=NO_DATA_FOUND)
        return ToolResult({"table": table, "id": rid, "fields": row})


class FsWrite(Tool):
    name = "fs.write"
    fields = (Field("path", ArgType.STRING), Field("contents", ArgType.STRING))
    rollback = RollbackKind.SAGA

    def prefetch(self, args: Mapping[str, Any]) -> Sequence[tuple[str, Any]]:
        path = args.get("path")
        return [("fs", path)] if isinstance(path, str) and _literal(path) else []

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        written = await cast(FsContext, ctx).fs_write(args["path"], args["contents"])
        return ToolResult({"path": args["path"], "bytes": written})


class FsRead(Tool):
    name = "fs.read"
    fields = (Field("path", ArgType.STRING),)
    rollback = RollbackKind.READ_ONLY

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        contents = await cast(FsContext, ctx).fs_read(args["path"])
        return ToolResult({"path": args["path"], "contents": contents})


class EffectStage(Tool):
    name = "effect.stage"
    fields = (
        Field("channel", ArgType.STRING),
        Field("payload", ArgType.ANY, required=False),
        Field("idempotency_key", ArgType.STRING, required=False),
    )
    rollback = RollbackKind.EFFECT

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        key = ctx.stage_effect(args["channel"], args["payload"], args["idempotency_key"])
        return ToolResult({"staged": True, "channel": args["channel"], "idempotency_key": key})


BUILTIN_TOOLS: tuple[type[Tool], ...] = (
    KvPut, KvGet, KvDelete, RecordInsert, RecordGet, FsWrite, FsRead, EffectStage,
)
