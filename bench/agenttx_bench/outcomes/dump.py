"""Read back what a run left behind: committed kv and records from etcd, the sandbox's
files, and the receiver's confirmed deliveries, as a `State` for the oracle.

Why one reader for all systems: AgentTx commits into `<prefix>/data/...` with the key
layout of `agenttx.contracts.layout`, and the baselines write the very same layout directly
(`direct`), so one reader judges both the same way. Only the run's namespace is read
(kv keys, record ids and file paths starting with it), a bounded set per run.

What it must never do: write anything, or read uncommitted transaction state (the
`tx/` subtree): only what another reader would see after the run counts.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from urllib.parse import unquote

from agenttx.contracts.layout import Keys
from agenttx.store.client import Store

from .receiver import Receiver
from .state import State


def _record_prefix(keys: Keys, table: str, ns: str) -> bytes:
    """The etcd prefix of `table`'s rows whose (string) id starts with `ns`: the encoded
    id of `ns` itself, minus its closing quote (`%22`)."""
    full = keys.record(table, ns)
    assert full.endswith(b"%22"), full
    return full[:-3]


def _files(root: pathlib.Path, ns: str) -> dict[str, str]:
    base = root / ns
    if not base.is_dir():
        return {}
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8", errors="replace")
            for p in sorted(base.rglob("*")) if p.is_file()}


async def read_state(store: Store, keys: Keys, fs_root: pathlib.Path, receiver: Receiver,
                     ns: str, tables: tuple[str, ...]) -> State:
    state = State()
    kv_base = keys.kv("")
    for kv in await store.get_prefix(keys.kv(ns), what="outcomes dump"):
        state.kv[unquote(kv.key[len(kv_base):].decode())] = json.loads(kv.value)["value"]
    for table in tables:
        base = keys.record(table, "")[:-len(b"%22%22")]
        for kv in await store.get_prefix(_record_prefix(keys, table, ns), what="outcomes dump"):
            rid = json.loads(unquote(kv.key[len(base):].decode()))
            state.rows[(table, rid)] = json.loads(kv.value)["fields"]
    state.files = await asyncio.to_thread(_files, fs_root, ns)
    state.effects = receiver.delivered(ns)
    return state
