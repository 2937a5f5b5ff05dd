"""The step context: what one tool call sees and does, before anything is written.

A tool reads committed data plus the transaction's own live writes (isolation) and
buffers its writes here; nothing reaches etcd until the engine commits the step record
in one compare-and-swap. Every etcd key read is remembered with the mod_revision the
transaction first observed for it, which is what the commit later compares against.

Reads come from the snapshot fetched in the step's first round trip; a key that was not
prefetched (its name came from a `${steps…}` reference) costs one extra read.
"""

from __future__ import annotations

import base64
import pathlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..store.client import KeyValue, Store
from ..store.layout import Keys, encode_id
from ..tools.base import ToolError
from . import sandbox
from .model import from_json


def kv_data_id(key: str) -> str:
    return f"kv:{key}"


def rec_data_id(table: str, record_id: Any) -> str:
    return f"rec:{table}:{encode_id(record_id)}"


def fs_data_id(path: str) -> str:
    return f"fs:{path}"


def lock_path(path: str) -> str:
    """The lock name of a sandbox path: its normalised spelling (not its realpath), so it
    can be computed before the transaction's root is known and prefetched."""
    return str(pathlib.PurePosixPath(path))


LOCK_MESSAGE = 'could not obtain lock on row in relation "fs"'


@dataclass
class Overlay:
    """The transaction's live writes, latest first-wins per key, built from step records."""

    kv: dict[str, dict[str, Any]] = field(default_factory=dict)      # key -> {value, deleted}
    rec: dict[str, dict[str, Any]] = field(default_factory=dict)     # etcd key -> row doc
    observed: dict[str, int] = field(default_factory=dict)           # etcd key -> mod_revision
    effects: int = 0
    locks: dict[str, str] = field(default_factory=dict)              # lock key -> path
    write_bytes: int = 0                                             # commit payload so far

    @classmethod
    def build(cls, steps: Iterable[Mapping[str, Any]]) -> Overlay:
        o = cls()
        for rec in steps:  # ascending step order: later writes win
            for k, rev in rec.get("observed", {}).items():
                o.observed.setdefault(k, rev)
            for k, w in rec.get("kv", {}).items():
                o.kv[k] = w
            for k, row in rec.get("rec", {}).items():
                o.rec[k] = row
            o.effects += len(rec.get("effects", []))
            o.write_bytes += int(rec.get("write_bytes", 0))
            fs = rec.get("fs")
            if fs:
                o.locks[fs["lock"]] = fs["path"]
        return o

    def write_keys(self, keys: Keys) -> set[str]:
        return {keys.kv(k).decode() for k in self.kv} | set(self.rec)


class StepContext:
    """Implements tools.base.ToolContext and FsContext for one step."""

    def __init__(
        self,
        *,
        store: Store,
        keys: Keys,
        tx_id: str,
        step_id: int,
        fs_root: str,
        overlay: Overlay,
        prefetched: dict[bytes, KeyValue | None],
        channel_names: Callable[[], list[str]],
        covered: Iterable[bytes] = (),
    ) -> None:
        self.covered = tuple(covered)
        self.store = store
        self.keys = keys
        self.tx_id = tx_id
        self.step_id = step_id
        self.fs_root = fs_root
        self.overlay = overlay
        self.prefetched = prefetched
        self.channel_names = channel_names
        self.extra_reads = 0
        # what this step did
        self.kv: dict[str, dict[str, Any]] = {}
        self.rec: dict[str, dict[str, Any]] = {}
        self.observed: dict[str, int] = {}
        self.touched: set[str] = set()
        self.writes: set[str] = set()
        self.deletes: set[str] = set()
        self.effects: list[dict[str, Any]] = []
        self.fs: dict[str, Any] | None = None
        self.write_bytes = 0

    async def _committed(self, key: bytes) -> KeyValue | None:
        if key not in self.prefetched:
            self.extra_reads += 1
            self.prefetched[key] = await self.store.get(key)
        kv = self.prefetched[key]
        skey = key.decode()
        if skey not in self.observed:
            self.observed[skey] = self.overlay.observed.get(skey, kv.mod_revision if kv else 0)
        return kv

    # ---- kv ----------------------------------------------------------------------
    async def kv_get(self, key: str) -> tuple[bool, Any]:
        self.touched.add(kv_data_id(key))
        w = self.kv.get(key) or self.overlay.kv.get(key)
        if w is None:
            kv = await self._committed(self.keys.kv(key))
            if kv is None:
                return False, None
            return True, from_json(kv.value)["value"]
        if key not in self.kv:
            self._carry_observed(self.keys.kv(key))
        return (False, None) if w["deleted"] else (True, w["value"])

    def _carry_observed(self, key: bytes) -> None:
        skey = key.decode()
        if skey in self.overlay.observed:
            self.observed.setdefault(skey, self.overlay.observed[skey])

    async def _ensure_observed(self, key: bytes) -> None:
        skey = key.decode()
        if skey in self.observed:
            return
        if skey in self.overlay.observed:
            self.observed[skey] = self.overlay.observed[skey]
            return
        await self._committed(key)

    async def kv_put(self, key: str, value: Any) -> None:
        self.touched.add(kv_data_id(key))
        self.writes.add(kv_data_id(key))
        await self._ensure_observed(self.keys.kv(key))
        self.kv[key] = {"value": value, "deleted": False}

    async def kv_delete(self, key: str) -> bool:
        existed, _ = await self.kv_get(key)
        self.deletes.add(kv_data_id(key))
        self.kv[key] = {"value": None, "deleted": True}  # tombstone
        return existed

    # ---- records -------------------------------------------------------------------
    async def record_get(self, table: str, record_id: Any) -> dict[str, Any] | None:
        self.touched.add(rec_data_id(table, record_id))
        key = self.keys.record(table, record_id)
        skey = key.decode()
        row = self.rec.get(skey) or self.overlay.rec.get(skey)
        if row is not None:
            self._carry_observed(key)
            return dict(row["fields"])
        kv = await self._committed(key)
        return None if kv is None else dict(from_json(kv.value)["fields"])

    async def record_insert(self, table: str, record_id: Any, fields: dict[str, Any]) -> None:
        key = self.keys.record(table, record_id)
        self.touched.add(rec_data_id(table, record_id))
        self.writes.add(rec_data_id(table, record_id))
        await self._ensure_observed(key)
        self.rec[key.decode()] = {"table": table, "id": record_id, "fields": fields}

    # ---- effects -------------------------------------------------------------------
    def stage_effect(self, channel: str, payload: Any, idempotency_key: str | None) -> str:
        names = self.channel_names()
        if channel not in names:
            raise ToolError(f'channel "{channel}" does not exist; configured channels: '
                            f"{', '.join(names)}", argument="channel")
        key = idempotency_key or f"{self.tx_id}-{self.step_id}-{uuid.uuid4().hex[:12]}"
        self.effects.append({"channel": channel, "payload": payload, "idempotency_key": key})
        return key

    # ---- files ---------------------------------------------------------------------
    async def fs_write(self, path: str, contents: str) -> int:
        target = sandbox.confine(self.fs_root, path)
        rel = str(target.relative_to(sandbox.confine_root(self.fs_root)))
        self.touched.add(fs_data_id(rel))
        self.writes.add(fs_data_id(rel))
        lock = self.keys.fs_lock(self.fs_root, lock_path(path))
        holder = await self._committed_lock(lock)
        if holder is not None and holder != self.tx_id:
            raise ToolError(f"{LOCK_MESSAGE}\nDETAIL:  Path '{path}' is locked by another "
                            "transaction.", argument="path", data=fs_data_id(rel))
        data = contents.encode("utf-8")
        previous = sandbox.read_state(target, path)
        tmp = sandbox.temp_name(target, self.tx_id, self.step_id)
        sandbox.write_temp(target, tmp, data, path)
        self.fs = {
            "path": rel,
            "lock": lock.decode(),
            "lock_new": holder is None,
            "existed": previous is not None,
            "previous": base64.b64encode(previous).decode() if previous is not None else None,
            "new_sha256": sandbox.sha256(data),
            "tmp": str(tmp),
            "target": str(target),
            "state": "applying",
        }
        return len(data)

    async def _committed_lock(self, lock: bytes) -> str | None:
        if lock not in self.prefetched and any(lock.startswith(p) for p in self.covered):
            self.prefetched[lock] = None  # its prefix was read: absent
        if lock not in self.prefetched:
            self.extra_reads += 1
            self.prefetched[lock] = await self.store.get(lock)
        kv = self.prefetched[lock]
        return kv.value.decode() if kv else None

    async def fs_read(self, path: str) -> str:
        target = sandbox.confine(self.fs_root, path)
        rel = str(target.relative_to(sandbox.confine_root(self.fs_root)))
        self.touched.add(fs_data_id(rel))
        data = sandbox.read_state(target, path)
        if data is None:
            raise ToolError(f"No such file or directory: '{path}'", argument="path",
                            data=fs_data_id(rel))
        return data.decode("utf-8", errors="replace")

    def record(self, *, tool: str, output: Any, raw_context: str, refs: Iterable[int]) -> dict[str, Any]:
        """The step record stored in etcd for this (successful) step."""
        return {
            "step_id": self.step_id,
            "tool": tool,
            "output": output,
            "raw_context": raw_context,
            "refs": sorted(set(refs)),
            "touched": sorted(self.touched),
            "writes": sorted(self.writes),
            "deletes": sorted(self.deletes),
            "kv": self.kv,
            "rec": self.rec,
            "observed": self.observed,
            "effects": self.effects,
            "fs": self.fs,
            "write_bytes": self.write_bytes,
        }
