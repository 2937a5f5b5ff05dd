"""The baselines' tools: AgentTx's own built-in tools, applied directly, with no transaction.

Why it is built from the same parts: the baselines must differ from AgentTx in one thing
only — transactions. So a call is parsed by the same JSON argument parser, validated by
the same argument models and executed by the same `agenttx.tools.builtin` classes, but
against a context that writes straight through: kv and records into etcd (the same key
layout under its own prefix, via `agenttx.store.client`), files into a plain sandbox
directory, effects POSTed to the receiver the moment they are staged. What a framework
without transactions gets is exactly that: every call takes effect at once, nothing is
isolated, nothing is undone.

A failed call raises `ToolFailure` with the raw message the tool produced (no cleaner:
the baselines get what a bare tool gives them).

What it must never do: buffer, lock, retry or undo anything — that would be a
transaction system, and the comparison would be void.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import uuid
from typing import Any

from agenttx.args.jsonargs import ArgumentsError, parse_arguments
from agenttx.contracts.layout import Keys
from agenttx.effects.channels import ChannelRegistry, DeliveryError, Effect
from agenttx.engine import sandbox
from agenttx.errors import StoreError
from agenttx.store.client import Store
from agenttx.tools.base import Tool, ToolError, validate_arguments
from agenttx.tools.builtin import BUILTIN_TOOLS

from .state import State


class ToolFailure(Exception):
    """A direct tool call failed; the message is the tool's raw error."""


class _Context:
    """ToolContext + FsContext writing through to etcd, the sandbox and the receiver."""

    def __init__(self, tools: DirectTools) -> None:
        self._t = tools
        self.tx_id = ""
        self.step_id = 0
        self.fs_root = str(tools.fs_root)
        self.staged: list[tuple[str, Any, str]] = []

    async def kv_get(self, key: str) -> tuple[bool, Any]:
        kv = await self._t.store.get(self._t.keys.kv(key))
        return (False, None) if kv is None else (True, json.loads(kv.value)["value"])

    async def kv_put(self, key: str, value: Any) -> None:
        await self._t.store.put(self._t.keys.kv(key), _doc({"value": value}))

    async def kv_delete(self, key: str) -> bool:
        existed, _ = await self.kv_get(key)
        await self._t.store.delete(self._t.keys.kv(key))
        return existed

    async def record_get(self, table: str, record_id: str | int | float) -> dict[str, Any] | None:
        kv = await self._t.store.get(self._t.keys.record(table, record_id))
        return None if kv is None else dict(json.loads(kv.value)["fields"])

    async def record_insert(self, table: str, record_id: str | int | float,
                            fields: dict[str, Any]) -> None:
        await self._t.store.put(self._t.keys.record(table, record_id), _doc({"fields": fields}))

    def stage_effect(self, channel: str, payload: Any, idempotency_key: str | None) -> str:
        if not self._t.registry.has(channel):
            raise ToolError(f'channel "{channel}" does not exist; configured channels: '
                            f"{', '.join(self._t.registry.names())}", argument="channel")
        key = idempotency_key or uuid.uuid4().hex
        self.staged.append((channel, payload, key))
        return key

    async def fs_write(self, path: str, contents: str) -> int:
        target = sandbox.confine(self.fs_root, path)
        data = contents.encode("utf-8")
        await asyncio.to_thread(_write, target, data, path)
        return len(data)

    async def fs_read(self, path: str) -> str:
        target = sandbox.confine(self.fs_root, path)
        data = await asyncio.to_thread(sandbox.read_state, target, path)
        if data is None:
            raise ToolError(f"No such file or directory: '{path}'", argument="path")
        return data.decode("utf-8", errors="replace")


def _doc(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _write(target: pathlib.Path, data: bytes, path: str) -> None:
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    sandbox.write_temp(target, tmp, data, path)
    os.replace(tmp, target)


class DirectTools:
    """Built-in tools over etcd prefix `prefix`, files under `fs_root`, effects to the
    channels of `registry`. Async methods run on the caller's event loop."""

    def __init__(self, store: Store, prefix: str, fs_root: pathlib.Path,
                 registry: ChannelRegistry) -> None:
        self.store = store
        self.keys = Keys(prefix)
        self.fs_root = fs_root
        self.registry = registry
        self._tools: dict[str, Tool] = {cls.name: cls() for cls in BUILTIN_TOOLS}

    async def call(self, tool_name: str, args_text: str) -> Any:
        """Run one tool call; its output, or ToolFailure with the raw error."""
        tool = self._tools.get(tool_name)
        if tool is None:
            raise ToolFailure(f"unknown tool {tool_name}")
        ctx = _Context(self)
        try:
            args = validate_arguments(parse_arguments(args_text), tool.fields)
            result = await tool.execute(args, ctx)
            for channel, payload, key in ctx.staged:
                await self.registry.deliver(Effect(channel, payload, key, ""))
        except (ArgumentsError, ToolError, DeliveryError, StoreError, OSError) as exc:
            raise ToolFailure(str(exc)) from None
        return result.output

    # ---- what the harness does around the agents (never through the agents' calls) -----

    async def seed(self, state: State) -> None:
        """Write a task's initial state (not counted as steps)."""
        for key, value in state.kv.items():
            await self.store.put(self.keys.kv(key), _doc({"value": value}))
        for (table, rid), fields in state.rows.items():
            await self.store.put(self.keys.record(table, rid), _doc({"fields": fields}))
        for path, contents in state.files.items():
            await asyncio.to_thread(_write, sandbox.confine(str(self.fs_root), path),
                                    contents.encode("utf-8"), path)

    async def kv_add(self, key: str, delta: int) -> None:
        """A concurrent writer's read-modify-write of a counter, straight to etcd."""
        kv = await self.store.get(self.keys.kv(key))
        assert kv is not None, key
        value = json.loads(kv.value)["value"] + delta
        await self.store.put(self.keys.kv(key), _doc({"value": value}))

    def file(self, path: str) -> pathlib.Path:
        return sandbox.confine(str(self.fs_root), path)
