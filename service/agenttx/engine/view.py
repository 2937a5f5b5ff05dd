"""What one tool call sees and does, before anything is written (the step's view).

A tool reads committed data plus the transaction's own live writes (isolation) and
buffers its writes here; nothing reaches etcd until the engine commits the step in one
compare-and-swap. The view records, for the step's CAS:

* `observed`: each key the transaction touches for the first time, with the state the
  view assumed for it (read this call, remembered by the replica, or absent when
  unknown). The CAS compares every one, so the step applies only if the assumption was
  right; otherwise the engine learns the real state from the CAS's failure branch and
  runs the step again. This is how a step costs one round trip and still records the
  exact revision each key had when the transaction first touched it (SPEC §2).
* `states`: the write state of each key after this step, and `before`, the state each
  had before it (the step's undo image: undo restores it).
* effects staged (with their idempotency reservations), the fs.write intent, the data
  ids touched (for provenance), and the reads the view had to make.

The view never writes to etcd; fs.write's temp file is the only thing it puts on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import pathlib
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..args.jsonargs import dumps
from ..contracts.layout import Keys, encode_id, fs_id
from ..contracts.outbox import idempotency_key_problem
from ..store.ops import KeyValue
from ..tools.base import INVALID_PARAMETER_VALUE, UNDEFINED_FILE, ToolError
from . import sandbox
from .cache import UNKNOWN, DataCache, TxState
from .state import NO_WRITE, Buffered, FsWrite, StagedEffect, Touched, WriteState, from_json

LOCK_MESSAGE = 'could not obtain lock on row in relation "fs"'

# Reads the view makes when it must: (touched-entry keys, committed keys) -> results.
Fetch = Callable[[list[bytes], list[bytes]], Awaitable[tuple[dict[bytes, Touched | None],
                                                                 dict[bytes, KeyValue | None]]]]
# The durable intent a toolset saga call needs before it is made (steps.Stepper writes it).
RecordIntent = Callable[[dict[str, Any], float], Awaitable[None]]


def kv_data_id(key: str) -> str:
    return f"kv:{key}"


def rec_data_id(table: str, record_id: Any) -> str:
    return f"rec:{table}:{encode_id(record_id)}"


def fs_data_id(rel: str) -> str:
    return f"fs:{rel}"


@dataclass
class FsPlan:
    """The temp file an fs.write step wrote and where it goes after the CAS."""

    tmp: pathlib.Path
    target: pathlib.Path
    record: FsWrite


class StepView:
    """Implements tools.base.ToolContext and FsContext for one step attempt."""

    def __init__(self, *, keys: Keys, state: TxState, data: DataCache, fetch: Fetch,
                 step_id: int, attempt: str, owner: str, channel_names: Callable[[], list[str]],
                 fresh: bool, record_intent: RecordIntent | None = None) -> None:
        self.keys = keys
        self.state = state
        self.data = data
        self._fetch = fetch
        self.tx_id = state.header.id
        self.step_id = step_id
        self.attempt = attempt
        self.fs_root = state.header.policy.fs_root
        self.owner = owner
        self.channel_names = channel_names
        # fresh: never assume a key's state, read it (for custom saga tools, which change
        # the world before the CAS and must not run on a guess).
        self.fresh = fresh
        self.extra_reads = 0
        # what this step did
        self.observed: dict[bytes, int] = {}
        # every committed state the step relied on (first touches and re-reads): the CAS
        # compares each, so the step ran on what etcd holds at the step's revision
        self.assumed: dict[bytes, int] = {}
        self.seen: dict[bytes, KeyValue | None] = {}
        self.fetched: dict[bytes, Touched | None] = {}
        self.states: dict[bytes, WriteState] = {}
        self.before: dict[bytes, tuple[int | None, WriteState]] = {}
        self.ids: dict[bytes, str] = {}
        self.touched: set[str] = set()
        self.effects: list[StagedEffect] = []
        self.effect_keys: list[bytes] = []
        self.effect_bytes = 0
        self.fs: FsPlan | None = None
        self.lock_new: bytes | None = None     # fs lock this step takes (compare absent)
        self.lock_held: bytes | None = None    # fs lock this transaction holds already
        self._record_intent = record_intent

    # ---- entries and committed state ---------------------------------------------------

    async def _entry(self, data_key: bytes) -> Touched | None:
        if data_key in self.fetched:
            return self.fetched[data_key]
        found = self.state.entry(data_key)
        if found is not UNKNOWN:
            return found  # type: ignore[return-value]
        entries, committed = await self._fetch([data_key], [] if data_key.startswith(b"fs:")
                                               else [data_key])
        self.extra_reads += 1
        self.fetched[data_key] = entries.get(data_key)
        for k, kv in committed.items():
            self.data.remember(k, kv)
        return self.fetched[data_key]

    async def _assume(self, key: bytes, need_value: bool) -> KeyValue | None:
        """The committed state of `key` this step assumes (validated by the CAS)."""
        if key in self.seen:
            return self.seen[key]
        known, found = self.data.lookup(key, need_value=need_value)
        if not known and (self.fresh or self.data.lookup(key, need_value=False)[0]):
            # read it: a saga must not run on a guess, and a key known to exist but
            # whose value is too large to remember must be read to be seen
            found = await self._read_committed(key)
        # unknown and not fresh: assume absent; the CAS checks it
        return self._see(key, found)

    async def _current(self, data_key: bytes, data_id: str, *, need_value: bool
                       ) -> tuple[WriteState, KeyValue | None]:
        """This step's view of a data key: its write state and, when the transaction
        has no buffered write for it, the committed key-value."""
        self.ids.setdefault(data_key, data_id)
        self.touched.add(data_id)
        if data_key in self.states:
            return self.states[data_key], None
        entry = await self._entry(data_key)
        if entry is None:
            if data_key not in self.observed:
                kv = await self._assume(data_key, need_value)
                self.observed[data_key] = kv.mod_revision if kv is not None else 0
            return NO_WRITE, self.seen.get(data_key)
        if entry.state.write is not None or not need_value:
            return entry.state, None
        kv = await self._committed_value(data_key, entry.observed or 0)
        return entry.state, kv

    async def _committed_value(self, key: bytes, observed: int) -> KeyValue | None:
        """The committed value of a key the transaction touched before (no write)."""
        if key in self.seen:
            return self.seen[key]
        known, kv = self.data.lookup(key)
        if not known:
            kv = await self._read_committed(key)
        # A value that changed since the transaction observed it dooms the commit (its
        # compare will fail); the step still sees the newest committed value, which the
        # step's CAS checks like any assumption.
        return self._see(key, kv)

    async def _read_committed(self, key: bytes) -> KeyValue | None:
        """One key read from etcd beyond the step's first read (and remembered)."""
        _, committed = await self._fetch([], [key])
        self.extra_reads += 1
        kv = committed.get(key)
        self.data.remember(key, kv)
        return kv

    def _see(self, key: bytes, kv: KeyValue | None) -> KeyValue | None:
        """Record that this step relies on `kv` being `key`'s committed state."""
        self.seen[key] = kv
        self.assumed[key] = kv.mod_revision if kv is not None else 0
        return kv

    def _set(self, data_key: bytes, before: WriteState, write: Buffered | None, op: str,
             lock: bytes | None = None) -> None:
        if data_key not in self.before:
            entry = self.fetched.get(data_key) if data_key in self.fetched else \
                self.state.entries.get(data_key)
            observed = entry.observed if entry is not None else self.observed.get(data_key)
            self.before[data_key] = (observed, before)
        current = self.states.get(data_key)
        if current is not None and current.writer == self.step_id and current.writer_op != op:
            op = "both"
        self.states[data_key] = WriteState(write, self.step_id, op,
                                           before.lock if lock is None else lock)

    # ---- kv ----------------------------------------------------------------------------

    async def kv_get(self, key: str) -> tuple[bool, Any]:
        ws, kv = await self._current(self.keys.kv(key), kv_data_id(key), need_value=True)
        if ws.write is not None:
            return (False, None) if ws.write.deleted else (True, ws.write.doc["value"])
        if kv is None:
            return False, None
        return True, from_json(kv.value)["value"]

    async def kv_put(self, key: str, value: Any) -> None:
        dk = self.keys.kv(key)
        ws, _ = await self._current(dk, kv_data_id(key), need_value=False)
        doc = {"value": value}
        raw = dumps(doc).encode()
        self._set(dk, ws, Buffered(False, doc, len(raw), raw), "put")

    async def kv_delete(self, key: str) -> bool:
        existed, _ = await self.kv_get(key)
        dk = self.keys.kv(key)
        self._set(dk, self.states.get(dk) or await self._write_state(dk),
                  Buffered(True), "delete")
        return existed

    async def _write_state(self, data_key: bytes) -> WriteState:
        entry = await self._entry(data_key)
        return entry.state if entry is not None else NO_WRITE

    # ---- records -----------------------------------------------------------------------

    async def record_get(self, table: str, record_id: Any) -> dict[str, Any] | None:
        ws, kv = await self._current(self.keys.record(table, record_id),
                                     rec_data_id(table, record_id), need_value=True)
        if ws.write is not None:
            return None if ws.write.deleted else dict(ws.write.doc["fields"])
        return None if kv is None else dict(from_json(kv.value)["fields"])

    async def record_insert(self, table: str, record_id: Any, fields: dict[str, Any]) -> None:
        dk = self.keys.record(table, record_id)
        ws, _ = await self._current(dk, rec_data_id(table, record_id), need_value=False)
        doc = {"fields": fields}
        raw = dumps(doc).encode()
        self._set(dk, ws, Buffered(False, doc, len(raw), raw), "put")

    # ---- effects -----------------------------------------------------------------------

    def stage_effect(self, channel: str, payload: Any, idempotency_key: str | None) -> str:
        names = self.channel_names()
        if channel not in names:
            raise ToolError(f'channel "{channel}" does not exist; configured channels: '
                            f"{', '.join(names)}", argument="channel",
                            category="undefined_object")
        if idempotency_key:  # absent or empty: generate one (docs/tools.md)
            problem = idempotency_key_problem(idempotency_key)
            if problem is not None:
                raise ToolError(f"idempotency_key: {problem}", argument="idempotency_key",
                                category=INVALID_PARAMETER_VALUE)
        return self._stage(channel, payload, idempotency_key)

    def stage_deferred(self, channel: str, payload: Any) -> str:
        """Stage a toolset's deferred call: an effect on the toolset's own channel
        (`toolset:<ns>/<name>`, which no configured channel and no `effect.stage` can
        name), with a generated idempotency key reserved like any effect's."""
        return self._stage(channel, payload, None)

    async def record_intent(self, intent: dict[str, Any], timeout_s: float) -> None:
        """Make a toolset saga call's intent durable before the call (one CAS)."""
        if self._record_intent is None:
            raise RuntimeError("this step cannot record a saga intent")
        await self._record_intent(intent, timeout_s)

    def _stage(self, channel: str, payload: Any, idempotency_key: str | None) -> str:
        key = idempotency_key or f"{self.tx_id}-{self.step_id}-{uuid.uuid4().hex[:12]}"
        reservation = self.keys.effect_key(self.owner, key)
        taken = reservation in self.effect_keys or self._staged_here(key)
        if not taken:
            known, held = self.data.lookup(reservation)
            taken = known and held is not None
            if taken and held is not None:
                self.assumed[reservation] = held.mod_revision  # the CAS checks the guess
        if taken:
            raise ToolError(
                'duplicate key value violates unique constraint "effects_pkey"\n'
                f"DETAIL:  Key (idempotency_key)=({key}) already exists.",
                argument="idempotency_key", category="unique_violation")
        self.effect_keys.append(reservation)
        effect = StagedEffect(channel, payload, key)
        self.effects.append(effect)
        self.effect_bytes += len(dumps([channel, payload, key]).encode())
        return key

    def _staged_here(self, key: str) -> bool:
        return any(e.idempotency_key == key for effects in self.state.effects.values()
                   for e in effects)

    # ---- files -------------------------------------------------------------------------

    async def fs_write(self, path: str, contents: str) -> int:
        target = sandbox.confine(self.fs_root, path)
        rel = str(target.relative_to(sandbox.confine_root(self.fs_root)))
        fid = fs_id(rel)
        self.ids.setdefault(fid, fs_data_id(rel))
        self.touched.add(fs_data_id(rel))
        ws = self.states.get(fid) or await self._write_state(fid)
        lock = self.keys.fs_lock(str(target))
        if not ws.lock:
            _, holder = self.data.lookup(lock)
            holder_id = holder.value.decode() if holder is not None else None
            if holder_id is not None and holder_id != self.tx_id:
                assert holder is not None
                self.assumed[lock] = holder.mod_revision  # the CAS checks the guess
                raise ToolError(f"{LOCK_MESSAGE}\nDETAIL:  Path '{path}' is locked by another "
                                "transaction.", argument="path", data=fs_data_id(rel),
                                category="lock_not_available")
        data = contents.encode("utf-8")
        previous = await asyncio.to_thread(sandbox.read_state, target, path)
        tmp = sandbox.temp_name(target, self.tx_id, self.step_id, self.attempt)
        await asyncio.to_thread(sandbox.write_temp, target, tmp, data, path)
        if self.fs is not None:  # a tool writing twice in one step: keep the last
            await asyncio.to_thread(sandbox.discard_temp, self.fs.tmp)
        lock_new = not ws.lock
        self.fs = FsPlan(tmp, target, FsWrite(
            path=path, rel=rel, target=str(target), lock_key=lock, lock_new=lock_new,
            existed=previous is not None, previous=previous,
            new_sha256=hashlib.sha256(data).hexdigest()))
        if lock_new:
            self.lock_new = lock
        else:
            self.lock_held = lock
        self._set(fid, ws, None, "put", lock=lock)
        return len(data)

    async def fs_read(self, path: str) -> str:
        target = sandbox.confine(self.fs_root, path)
        rel = str(target.relative_to(sandbox.confine_root(self.fs_root)))
        self.touched.add(fs_data_id(rel))
        self.ids.setdefault(fs_id(rel), fs_data_id(rel))
        data = await asyncio.to_thread(sandbox.read_state, target, path)
        if data is None:
            raise ToolError(f"No such file or directory: '{path}'", argument="path",
                            data=fs_data_id(rel), category=UNDEFINED_FILE)
        return data.decode("utf-8", errors="replace")

    async def discard(self) -> None:
        """Drop what this attempt put on disk (its temp file)."""
        if self.fs is not None:
            await asyncio.to_thread(sandbox.discard_temp, self.fs.tmp)
            self.fs = None

    # ---- provenance --------------------------------------------------------------------

    def entries_of_touched(self) -> Iterable[tuple[str, WriteState]]:
        """(data id, write state before this step) of every data key the step touched
        that the transaction had written: who last wrote what the step depends on."""
        for dk, data_id in self.ids.items():
            if dk in self.before:
                yield data_id, self.before[dk][1]
                continue
            entry = self.fetched.get(dk) if dk in self.fetched else self.state.entries.get(dk)
            if entry is not None:
                yield data_id, entry.state
