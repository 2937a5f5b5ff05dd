"""The baselines' tools: an agent without AgentTx, calling eight small tools of its own.

Why the benchmark has its own: the baselines are "the same agent, no transactions", so
their tools must do what AgentTx's built-ins do as far as the oracle can see — kv values,
rows with a primary key and foreign keys, UTF-8 files, effects POSTed to the webhook —
but nothing of AgentTx may be in them (a benchmark is a user, not a part:
docs/benchmarks.md). So they are written here from the built-ins' documented behaviour
(README.md, "What a step can do"; docs/recovery.md for the failures): kv and records in
the benchmark's etcd under a prefix of their own (through `aetcd` directly, one key per
value or row), files in a directory of their own, effects POSTed the moment they are
staged. What a framework without transactions gets is
exactly that: every call takes effect at once, nothing is isolated, nothing is undone.

Arguments are checked the way the built-ins check them (malformed JSON, a missing,
unknown or mistyped argument, a bad table name or path fail the call), so a garbled call
fails here as it fails in AgentTx. A failed call raises `ToolFailure` with a raw,
PostgreSQL/POSIX-style message; the baseline agents react to the failure, never to its
wording.

What it must never do: buffer, lock, retry or undo anything — that would be a
transaction system, and the comparison would be void.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import pathlib
import re
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any

import aetcd

from .dump import Items
from .state import State

TABLE_NAME = re.compile(r"[A-Za-z0-9_]{1,128}")
DELIVERY_TIMEOUT_S = 10.0

_STRING, _ID, _OBJECT, _ANY = "a string", "a string or number", "a map", "any value"
# tool -> argument -> (required, expected type): the built-ins' arguments.
SCHEMAS: dict[str, dict[str, tuple[bool, str]]] = {
    "kv.put": {"key": (True, _STRING), "value": (False, _ANY)},
    "kv.get": {"key": (True, _STRING)},
    "kv.delete": {"key": (True, _STRING)},
    "record.insert": {"table": (True, _STRING), "id": (True, _ID), "fields": (False, _OBJECT),
                      "references": (False, _OBJECT)},
    "record.get": {"table": (True, _STRING), "id": (True, _ID)},
    "fs.write": {"path": (True, _STRING), "contents": (True, _STRING)},
    "fs.read": {"path": (True, _STRING)},
    "effect.stage": {"channel": (True, _STRING), "payload": (False, _ANY),
                     "idempotency_key": (False, _STRING)},
}


class ToolFailure(Exception):
    """A direct tool call failed; the message is the tool's raw error."""


# ---- arguments (pure) --------------------------------------------------------------------

def _is(value: Any, expected: str) -> bool:
    if expected == _STRING:
        return isinstance(value, str)
    if expected == _ID:
        return isinstance(value, str | int | float) and not isinstance(value, bool)
    if expected == _OBJECT:
        return isinstance(value, dict)
    return True


def parse_arguments(tool: str, text: str) -> dict[str, Any]:
    """The call's arguments as a dict, or ToolFailure saying what is wrong with them."""
    schema = SCHEMAS.get(tool)
    if schema is None:
        raise ToolFailure(f"unknown tool {tool}; tools: {', '.join(sorted(SCHEMAS))}")
    try:
        args = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolFailure(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(args, dict):
        raise ToolFailure(f"invalid type: {type(args).__name__}, expected a map")
    for name in args:
        if name not in schema:
            raise ToolFailure(f"unknown field `{name}`, expected one of "
                              + ", ".join(f"`{f}`" for f in schema))
    for name, (required, expected) in schema.items():
        if name not in args or (args[name] is None and not required):
            if required:
                raise ToolFailure(f"missing field `{name}`")
            args[name] = None
        elif not _is(args[name], expected):
            raise ToolFailure(f"{name}: invalid type: {json.dumps(args[name])}, expected {expected}")
    if "table" in args and not TABLE_NAME.fullmatch(args["table"]):
        raise ToolFailure(f'table: invalid value: "{args["table"]}", expected a name matching '
                          "[A-Za-z0-9_]{1,128}")
    return args


def confine(root: pathlib.Path, path: str) -> pathlib.Path:
    """`path` inside `root` (symlinks followed), or ToolFailure: relative paths only."""
    pure = pathlib.PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or "\x00" in path:
        raise ToolFailure(f'permission denied for path "{path}": it resolves outside the sandbox')
    real_root = pathlib.Path(os.path.realpath(root))
    target = pathlib.Path(os.path.realpath(real_root / pure))
    if target == real_root or not target.is_relative_to(real_root):
        raise ToolFailure(f'permission denied for path "{path}": it resolves outside the sandbox')
    return target


def _pg(value: Any) -> str:
    """A key value as PostgreSQL prints it in a DETAIL line."""
    return value if isinstance(value, str) else json.dumps(value)


def _doc(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# ---- blocking I/O (run in a worker thread) -----------------------------------------------

def write_file(target: pathlib.Path, data: bytes) -> None:
    """Atomically: a temp file in the same directory, fsync, rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)


def put_back(target: pathlib.Path, prior: bytes | None) -> None:
    """Make the file hold `prior` again (None: remove it)."""
    if prior is None:
        target.unlink(missing_ok=True)
    else:
        write_file(target, prior)


def _read_file(target: pathlib.Path) -> bytes | None:
    try:
        return target.read_bytes()
    except FileNotFoundError:
        return None


def _post(url: str, body: bytes, idempotency_key: str) -> None:
    """One webhook POST, shaped as AgentTx's webhook channel sends it (JSON
    `{channel, payload, idempotency_key, transaction_id}`, `Idempotency-Key` header);
    anything but a 2xx fails the call. Blocking: run in a worker thread."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=DELIVERY_TIMEOUT_S)
    try:
        conn.request("POST", parts.path or "/", body=body, headers={
            "Content-Type": "application/json", "Idempotency-Key": idempotency_key})
        resp = conn.getresponse()
        resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise ToolFailure(f"webhook delivery failed: {type(exc).__name__}: {exc}") from None
    finally:
        conn.close()
    if not 200 <= resp.status < 300:
        raise ToolFailure(f"webhook answered HTTP {resp.status} {resp.reason}".rstrip())


# ---- the tools ---------------------------------------------------------------------------

def _client(endpoint: str) -> aetcd.Client:
    host, _, port = endpoint.split("://", 1)[-1].rstrip("/").rpartition(":")
    return aetcd.Client(host, int(port), timeout=10)


class DirectTools:
    """The eight tools over etcd prefix `prefix` (at `endpoint`), files under `fs_root`,
    effects POSTed to `webhooks` (channel name -> URL). Async methods run on the caller's
    event loop; `close()` there too.

    Layout (the baselines' own, nothing shared with AgentTx): `<prefix>/kv/<key>` holds
    the value's JSON, `<prefix>/records/<table>/<id as JSON>` the row's fields."""

    def __init__(self, endpoint: str, prefix: str, fs_root: pathlib.Path,
                 webhooks: Mapping[str, str]) -> None:
        self.etcd = _client(endpoint)
        self.prefix = prefix.rstrip("/")
        self.fs_root = fs_root
        self.webhooks = dict(webhooks)

    async def close(self) -> None:
        await self.etcd.close()

    def _kv_key(self, key: str) -> bytes:
        return f"{self.prefix}/kv/{key}".encode()

    def _row_key(self, table: str, rid: Any) -> bytes:
        return f"{self.prefix}/records/{table}/{json.dumps(rid, ensure_ascii=False)}".encode()

    async def _get(self, key: bytes) -> Any:
        """The JSON stored at `key`, or `_ABSENT`."""
        got = await self.etcd.get(key)
        return _ABSENT if got is None else json.loads(got.value)

    async def call(self, tool: str, args_text: str) -> Any:
        """Run one tool call; its output, or ToolFailure with the raw error."""
        args = parse_arguments(tool, args_text)
        try:
            return await getattr(self, "_" + tool.replace(".", "_"))(args)
        except aetcd.ClientError as exc:
            raise ToolFailure(f"etcd: {type(exc).__name__}: {exc}") from None
        except OSError as exc:
            raise ToolFailure(f"{exc.strerror or type(exc).__name__}: '{args.get('path')}'") from None

    async def _kv_put(self, args: dict[str, Any]) -> Any:
        await self.etcd.put(self._kv_key(args["key"]), _doc(args["value"]))
        return {"key": args["key"], "value": args["value"]}

    async def _kv_get(self, args: dict[str, Any]) -> Any:
        value = await self._get(self._kv_key(args["key"]))
        if value is _ABSENT:
            raise ToolFailure(f'no row with key={args["key"]} in table "kv"')
        return {"key": args["key"], "value": value}

    async def _kv_delete(self, args: dict[str, Any]) -> Any:
        deleted = await self.etcd.delete(self._kv_key(args["key"]))
        return {"key": args["key"], "deleted": deleted is not None}

    async def _record_insert(self, args: dict[str, Any]) -> Any:
        table, rid = args["table"], args["id"]
        fields, references = args["fields"] or {}, args["references"] or {}
        # PostgreSQL's order, as the built-in's: NOT NULL, the primary key, foreign keys.
        for column in references:
            if fields.get(column) is None:
                raise ToolFailure(f'null value in column "{column}" of relation "{table}" '
                                  "violates not-null constraint")
        duplicate = ToolFailure(f'duplicate key value violates unique constraint "{table}_pkey"\n'
                                f"DETAIL:  Key (id)=({_pg(rid)}) already exists.")
        if await self._get(self._row_key(table, rid)) is not _ABSENT:
            raise duplicate
        for column, ref_table in references.items():
            value = fields[column]
            if not isinstance(ref_table, str) or not TABLE_NAME.fullmatch(ref_table):
                raise ToolFailure(f"references.{column}: invalid value, expected a table name")
            if await self._get(self._row_key(ref_table, value)) is _ABSENT:
                raise ToolFailure(
                    f'insert or update on table "{table}" violates foreign key constraint '
                    f'"{table}_{column}_fkey"\nDETAIL:  Key ({column})=({_pg(value)}) is not '
                    f'present in table "{ref_table}".')
        key = self._row_key(table, rid)
        tx = self.etcd.transactions
        inserted, _ = await self.etcd.transaction(compare=[tx.create(key) == 0],
                                                  success=[tx.put(key, _doc(fields))], failure=[])
        if not inserted:
            raise duplicate
        return {"table": table, "id": rid, "fields": fields}

    async def _record_get(self, args: dict[str, Any]) -> Any:
        table, rid = args["table"], args["id"]
        fields = await self._get(self._row_key(table, rid))
        if fields is _ABSENT:
            raise ToolFailure(f'no row with id={_pg(rid)} in table "{table}"')
        return {"table": table, "id": rid, "fields": fields}

    async def _fs_write(self, args: dict[str, Any]) -> Any:
        data = args["contents"].encode("utf-8")
        await asyncio.to_thread(write_file, confine(self.fs_root, args["path"]), data)
        return {"path": args["path"], "bytes": len(data)}

    async def _fs_read(self, args: dict[str, Any]) -> Any:
        data = await asyncio.to_thread(_read_file, confine(self.fs_root, args["path"]))
        if data is None:
            raise ToolFailure(f"No such file or directory: '{args['path']}'")
        return {"path": args["path"], "contents": data.decode("utf-8", errors="replace")}

    async def _effect_stage(self, args: dict[str, Any]) -> Any:
        channel = args["channel"]
        url = self.webhooks.get(channel)
        if url is None:
            raise ToolFailure(f'channel "{channel}" does not exist; configured channels: '
                              f"{', '.join(sorted(self.webhooks))}")
        key = args["idempotency_key"] or uuid.uuid4().hex
        body = _doc({"channel": channel, "payload": args["payload"], "idempotency_key": key,
                     "transaction_id": ""})
        await asyncio.to_thread(_post, url, body, key)
        return {"staged": True, "channel": channel, "idempotency_key": key}

    # ---- what the harness does around the agents (never through the agents' calls) -----

    async def seed(self, state: State) -> None:
        """Write a task's initial state (not counted as steps)."""
        for key, value in state.kv.items():
            await self.etcd.put(self._kv_key(key), _doc(value))
        for (table, rid), fields in state.rows.items():
            await self.etcd.put(self._row_key(table, rid), _doc(fields))
        for path, contents in state.files.items():
            await asyncio.to_thread(write_file, self.file(path), contents.encode("utf-8"))

    async def kv_add(self, key: str, delta: int) -> None:
        """A concurrent writer's read-modify-write of a counter, straight to etcd."""
        value = await self._get(self._kv_key(key))
        assert value is not _ABSENT, key
        await self.etcd.put(self._kv_key(key), _doc(value + delta))

    def file(self, path: str) -> pathlib.Path:
        return confine(self.fs_root, path)

    async def read(self, items: Items) -> State:
        """The current value of each kv key, row and file in `items` (absent ones left
        out): what the run left behind, for the oracle."""
        state = State()
        for key in items.kv:
            value = await self._get(self._kv_key(key))
            if value is not _ABSENT:
                state.kv[key] = value
        for table, rid in items.rows:
            fields = await self._get(self._row_key(table, rid))
            if fields is not _ABSENT:
                state.rows[(table, rid)] = fields
        for path in items.files:
            data = await asyncio.to_thread(_read_file, self.file(path))
            if data is not None:
                state.files[path] = data.decode("utf-8", errors="replace")
        return state


_ABSENT: Any = object()
