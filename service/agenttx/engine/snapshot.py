"""Loading a transaction: from this replica's cache when it may be current, else from
etcd, reading only what the call needs.

A step needs the header, the outputs of the steps its arguments reference and the
entries of the keys its tool names (its prefetch); commit and abort need every touched
entry and staged effect; a rollback needs the records of the steps it undoes. Each is
one etcd round trip in the common case (ranges are read in bounded pages), so what a
call costs depends on what it touches, never on how many steps came before (SPEC §2).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..contracts.layout import Keys
from ..errors import NotFound
from ..store.ops import Get, KeyValue, KeyValueStore, prefix_end
from .cache import DataCache, TxCache, TxState
from .state import (
    GatedCall,
    StagedEffect,
    StepRecord,
    Touched,
    decode_effect,
    decode_gated,
    decode_header,
    decode_step,
    decode_touched,
)

# A transaction with at most this many touched entries / staged effects is loaded whole
# on a cache miss (in the same round trip), so the replica can serve it from cache next.
WHOLE_LOAD_LIMIT = 64
# etcd ranges are bounded by key count, not bytes, and a client refuses responses over
# store.client.MAX_MESSAGE_BYTES (64 MiB): a step record can approach a step's byte
# budget (engine.limits, 60 % of --max-request-bytes), so records are read 4 at a time.
RECORDS_PAGE = 4


def not_found(tx_id: str) -> NotFound:
    return NotFound(f"transaction {tx_id} not found (unknown, committed or aborted)")


class Loader:
    def __init__(self, store: KeyValueStore, keys: Keys, txs: TxCache, data: DataCache) -> None:
        self.store, self.keys, self.txs, self.data = store, keys, txs, data

    # ---- a step ------------------------------------------------------------------------

    async def for_step(self, tx_id: str, ref_steps: Iterable[int], data_keys: Sequence[bytes],
                       *, use_cache: bool = True) -> TxState:
        """The state a step runs on: the cached one, or one read in ONE round trip with
        the referenced steps' records and the entries + committed values of `data_keys`
        (and everything, when the transaction is small)."""
        if use_cache:
            cached = self.txs.get(tx_id)
            if cached is not None:
                return cached
        keys = self.keys
        refs = sorted(set(ref_steps))
        wanted = list(dict.fromkeys(data_keys))
        ops: list[Get] = [Get(keys.tx_header(tx_id)),
                          Get(keys.touched_prefix(tx_id),
                              prefix_end(keys.touched_prefix(tx_id)), WHOLE_LOAD_LIMIT + 1),
                          Get(keys.effects_prefix(tx_id),
                              prefix_end(keys.effects_prefix(tx_id)), WHOLE_LOAD_LIMIT + 1)]
        ops += [Get(keys.step(tx_id, n)) for n in refs]
        ops += [Get(keys.touched(tx_id, dk)) for dk in wanted]
        ops += [Get(dk) for dk in wanted if not dk.startswith(b"fs:")]
        res = await self.store.read(ops, what="load")
        state = self._header_state(tx_id, res.first(0))
        entries_kvs, effects_kvs = res.kvs(1), res.kvs(2)
        complete = len(entries_kvs) <= WHOLE_LOAD_LIMIT and len(effects_kvs) <= WHOLE_LOAD_LIMIT
        for kv in entries_kvs[:WHOLE_LOAD_LIMIT]:
            state.entries[keys.data_key_of_touched(tx_id, kv.key)] = decode_touched(kv.value)
        if complete:
            state.effects = self._effects(tx_id, effects_kvs)
            state.complete = True
        i = 3
        for n in refs:
            step_kv = res.first(i)
            i += 1
            if step_kv is not None and n in state.header.live:
                record = decode_step(step_kv.value)
                state.records[n] = record
                state.outputs[n] = record.output
        absent: set[bytes] = set()
        for dk in wanted:
            entry_kv = res.first(i)
            i += 1
            if entry_kv is not None:
                state.entries[dk] = decode_touched(entry_kv.value)
            else:
                absent.add(dk)
        for dk in wanted:
            if not dk.startswith(b"fs:"):
                self.data.remember(dk, res.first(i))
                i += 1
        state.absent = absent
        self.txs.put(tx_id, state, _cost(state))
        return state

    async def fetch(self, tx_id: str, entry_keys: list[bytes], data_keys: list[bytes]
                    ) -> tuple[dict[bytes, Touched | None], dict[bytes, KeyValue | None]]:
        """Touched entries and committed values a view needs mid-step: one round trip."""
        ops = [Get(self.keys.touched(tx_id, dk)) for dk in entry_keys] + \
            [Get(dk) for dk in data_keys]
        res = await self.store.read(ops, what="step read")
        entries: dict[bytes, Touched | None] = {}
        for i, dk in enumerate(entry_keys):
            kv = res.first(i)
            entries[dk] = decode_touched(kv.value) if kv is not None else None
        committed = {dk: res.first(len(entry_keys) + i) for i, dk in enumerate(data_keys)}
        return entries, committed

    async def outputs(self, state: TxState, steps: Iterable[int]) -> dict[int, Any]:
        """The outputs of live `steps` (read only when the state lacks them)."""
        live = state.header.live
        wanted = sorted(n for n in set(steps) if n in live)
        missing = [n for n in wanted if n not in state.outputs]
        if missing:
            for record in await self._read_records(state.header.id, missing):
                state.records[record.step_id] = record
                state.outputs[record.step_id] = record.output
        return {n: state.outputs[n] for n in wanted if n in state.outputs}

    # ---- rollback and commit -----------------------------------------------------------

    async def records(self, state: TxState, steps: Sequence[int]) -> list[StepRecord]:
        """Records of `steps` (live, in the given order), from the state or etcd."""
        missing = [n for n in steps if n not in state.records]
        if missing:
            for record in await self._read_records(state.header.id, missing):
                state.records[record.step_id] = record
                state.outputs.setdefault(record.step_id, record.output)
        return [state.records[n] for n in steps if n in state.records]

    async def _read_records(self, tx_id: str, steps: Sequence[int]) -> list[StepRecord]:
        keys = self.keys
        if len(steps) <= 16:
            got = await self.store.get_many([keys.step(tx_id, n) for n in steps], what="load")
            return [decode_step(kv.value) for kv in got.values() if kv is not None]
        wanted = set(steps)
        out: list[StepRecord] = []
        last = max(steps)
        async for page in self.store.pages(keys.steps_prefix(tx_id),
                                           start=keys.step(tx_id, min(steps)),
                                           page_size=RECORDS_PAGE, what="load"):
            records = [decode_step(kv.value) for kv in page]
            out += [r for r in records if r.step_id in wanted]
            if records and records[-1].step_id >= last:
                break
        return out

    async def whole(self, tx_id: str, *, use_cache: bool = True) -> TxState:
        """Every touched entry and staged effect (commit, abort): the cached state when
        complete, else read in pages."""
        if use_cache:
            cached = self.txs.get(tx_id)
            if cached is not None and cached.complete:
                return cached
        state = await self.for_step(tx_id, (), (), use_cache=False)
        if state.complete:
            return state
        keys = self.keys
        entries: dict[bytes, Touched] = {}
        async for page in self.store.pages(keys.touched_prefix(tx_id), what="load"):
            for kv in page:
                entries[keys.data_key_of_touched(tx_id, kv.key)] = decode_touched(kv.value)
        effects_kvs: list[KeyValue] = []
        async for page in self.store.pages(keys.effects_prefix(tx_id), what="load"):
            effects_kvs.extend(page)
        state.entries = entries
        state.effects = self._effects(tx_id, effects_kvs)
        state.complete = True
        state.absent = set()
        self.txs.put(tx_id, state, _cost(state))
        return state

    async def gated(self, tx_id: str) -> list[GatedCall]:
        """The gated calls of live steps (docs/approvals.md), in step order: read at
        commit only when the transaction's policy requires approvals."""
        out: list[GatedCall] = []
        async for page in self.store.pages(self.keys.gates_prefix(tx_id), page_size=16,
                                           what="load"):
            out += [decode_gated(kv.value) for kv in page]
        return out

    # ---- helpers -----------------------------------------------------------------------

    def _header_state(self, tx_id: str, kv: KeyValue | None) -> TxState:
        if kv is None:
            self.txs.evict(tx_id)
            raise not_found(tx_id)
        return TxState(header=decode_header(kv.value), rev=kv.mod_revision)

    def _effects(self, tx_id: str, kvs: Iterable[KeyValue]
                 ) -> dict[int, tuple[StagedEffect, ...]]:
        by_step: dict[int, list[StagedEffect]] = {}
        for kv in kvs:
            step = self.keys.step_of_effect(tx_id, kv.key)
            by_step.setdefault(step, []).append(decode_effect(kv.value))
        return {s: tuple(v) for s, v in by_step.items()}


def _cost(state: TxState) -> int:
    """Approximate bytes a cached state holds (outputs and fs undo images dominate)."""
    images = sum(len(r.fs.previous or b"") for r in state.records.values() if r.fs is not None)
    return 512 + 256 * (len(state.entries) + len(state.records)) + images + \
        sum(len(repr(o)) for o in state.outputs.values())
