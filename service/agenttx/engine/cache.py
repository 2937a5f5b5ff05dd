"""What one replica remembers between calls, so a step costs one etcd round trip.

Nothing here is trusted: it is a guess that the next compare-and-swap validates.

* `TxState` is a transaction as this replica last read or wrote it, at header revision
  `rev`. A step executes against it and CASes on `rev`; if another replica advanced the
  transaction meanwhile, the compare fails, nothing is written, and the engine reloads
  and executes again (docs/api.md#executestep: exactly one winner per step; a stale cache never loses a
  step). `complete` means the state holds every touched entry and staged effect of the
  transaction (this replica began it, or loaded all of it): then a key missing from
  `entries` was never touched.
* `DataCache` remembers committed keys (data rows, fs locks, idempotency reservations)
  as last seen. A step's first touch of a key assumes that state — absent when unknown —
  and the step's CAS carries `mod_revision == assumed`; a wrong guess loses the compare,
  the failure branch returns the real value, and the step runs again on it.

Both are bounded (LRU by approximate bytes), so a replica's memory stays flat however
many transactions it serves. Per-transaction locks serialise calls on one transaction
within a replica, so they queue instead of racing their own CAS.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..store.ops import KeyValue
from .state import StagedEffect, StepRecord, Touched, TxHeader

# Approximate per-object overheads for the byte accounting (CPython, 64-bit).
_ENTRY_OVERHEAD = 200
_MISSING = object()


@dataclass
class TxState:
    header: TxHeader
    rev: int
    entries: dict[bytes, Touched] = field(default_factory=dict)
    complete: bool = False
    outputs: dict[int, Any] = field(default_factory=dict)
    records: dict[int, StepRecord] = field(default_factory=dict)
    effects: dict[int, tuple[StagedEffect, ...]] = field(default_factory=dict)
    # Keys known NOT to have an entry (read this load), for incomplete states.
    absent: set[bytes] = field(default_factory=set)
    # This replica renamed the header's pending fs write itself: no disk check needed.
    fs_settled: bool = False
    cost: int = 0

    def entry(self, data_key: bytes) -> Touched | None | object:
        """The entry, None when the transaction never touched the key, or UNKNOWN."""
        found = self.entries.get(data_key)
        if found is not None:
            return found
        return None if self.complete or data_key in self.absent else UNKNOWN


UNKNOWN = object()


class TxCache:
    """tx id -> TxState, least recently used first out, bounded by bytes."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, TxState] = OrderedDict()
        self._bytes = 0
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def get(self, tx_id: str) -> TxState | None:
        state = self._items.get(tx_id)
        if state is not None:
            self._items.move_to_end(tx_id)
        return state

    def put(self, tx_id: str, state: TxState, cost: int) -> None:
        self.evict(tx_id)
        state.cost = cost + _ENTRY_OVERHEAD
        if state.cost > self.max_bytes // 4:
            return  # one huge transaction must not flush everyone else
        self._items[tx_id] = state
        self._bytes += state.cost
        while self._bytes > self.max_bytes and self._items:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.cost

    def grow(self, tx_id: str, state: TxState, extra: int) -> None:
        """Account for what a successful step added to a cached state."""
        if self._items.get(tx_id) is state:
            state.cost += extra
            self._bytes += extra
            if state.cost > self.max_bytes // 4:
                self.evict(tx_id)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.cost

    def evict(self, tx_id: str) -> None:
        old = self._items.pop(tx_id, None)
        if old is not None:
            self._bytes -= old.cost

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def locked(self, tx_id: str) -> _TxLock:
        """`async with txs.locked(tx_id)`: one call at a time per transaction here."""
        return _TxLock(self._locks, tx_id)


class _TxLock:
    """Per-transaction asyncio lock, dropped when no call holds or waits for it."""

    __slots__ = ("_locks", "_tx", "_lock")

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, int]], tx_id: str) -> None:
        self._locks, self._tx = locks, tx_id
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        lock, users = self._locks.get(self._tx, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[self._tx] = (lock, users + 1)
        self._lock = lock
        try:
            await lock.acquire()
        except BaseException:
            self._release_user()
            raise

    async def __aexit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.release()
        self._release_user()

    def _release_user(self) -> None:
        lock, users = self._locks[self._tx]
        if users <= 1:
            del self._locks[self._tx]
        else:
            self._locks[self._tx] = (lock, users - 1)


class DataCache:
    """Committed keys as last seen: key -> KeyValue, or None for 'absent'. Values too
    large to keep are remembered by revision only (enough to assume a key's state for a
    write; a read then fetches the value)."""

    def __init__(self, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, tuple[KeyValue | None, bool]] = OrderedDict()
        self._bytes = 0

    def lookup(self, key: bytes, *, need_value: bool = True) -> tuple[bool, KeyValue | None]:
        """(remembered?, the key-value or None for absent). With need_value, a key
        remembered by revision only counts as not remembered."""
        found = self._items.get(key)
        if found is None:
            return False, None
        kv, full = found
        if need_value and not full:
            return False, None
        self._items.move_to_end(key)
        return True, kv

    def remember(self, key: bytes, kv: KeyValue | None) -> None:
        self.forget(key)
        full = kv is None or _cost(key, kv) <= self.max_bytes // 16
        if not full and kv is not None:
            kv = KeyValue(kv.key, b"", kv.mod_revision, kv.create_revision, kv.lease)
        self._items[key] = (kv, full)
        self._bytes += _cost(key, kv)
        while self._bytes > self.max_bytes and self._items:
            k, (v, _) = self._items.popitem(last=False)
            self._bytes -= _cost(k, v)

    def forget(self, key: bytes) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= _cost(key, old[0])

    def __len__(self) -> int:
        return len(self._items)


def _cost(key: bytes, kv: KeyValue | None) -> int:
    return len(key) + (len(kv.value) if kv is not None else 0) + _ENTRY_OVERHEAD
