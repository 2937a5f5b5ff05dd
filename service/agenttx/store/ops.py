"""Typed etcd operations and results: plain data, no grpc, no aetcd.

The engine builds its compare-and-swaps from these (engine/ops.py) and reads typed
results; `store.client` is the only module that turns them into `etcdserverpb`
messages and sends them. `KeyValueStore` is the interface the engine is handed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

# ---- typed results -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class TxnResult:
    """One etcd transaction's outcome. `results[i]` answers the i-th operation of the
    branch that ran: the key-values of a `Get` (a list), None for writes."""

    succeeded: bool
    revision: int
    results: list[list[KeyValue] | None]

    def kvs(self, index: int) -> list[KeyValue]:
        found = self.results[index] if index < len(self.results) else None
        return found or []

    def first(self, index: int) -> KeyValue | None:
        found = self.kvs(index)
        return found[0] if found else None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch: the key, its new value (None: deleted) and the
    revision it happened at."""

    key: bytes
    value: bytes | None
    revision: int


# ---- typed operations ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete `key`, or every key in [key, range_end) when range_end is set."""

    key: bytes
    range_end: bytes = b""


@dataclass(frozen=True, slots=True)
class Get:
    """Read `key`, or [key, range_end) (at most `limit` keys when limit > 0)."""

    key: bytes
    range_end: bytes = b""
    limit: int = 0


Op = Put | Delete | Get

Target = Literal["mod", "create", "value", "lease"]
Relation = Literal["==", "!=", "<", ">"]


@dataclass(frozen=True, slots=True)
class Compare:
    """`key`'s `target` `relation` `operand`. etcd compares an absent key as all zeros:
    mod/create revision 0, no value, lease 0."""

    key: bytes
    target: Target
    relation: Relation
    operand: int | bytes


def op_put(key: bytes, value: bytes, lease: int = 0) -> Put:
    return Put(key, value, lease)


def op_delete(key: bytes) -> Delete:
    return Delete(key)


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range of `prefix` (etcd's range_end: prefix + 1)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # every key


def op_delete_prefix(prefix: bytes) -> Delete:
    return Delete(prefix, prefix_end(prefix))


def op_delete_from(start: bytes, prefix: bytes) -> Delete:
    """Delete every key of `prefix` from `start` on (e.g. steps >= j)."""
    return Delete(start, prefix_end(prefix))


def op_get(key: bytes) -> Get:
    return Get(key)


def op_get_prefix(prefix: bytes, limit: int = 0) -> Get:
    return Get(prefix, prefix_end(prefix), limit)


def cmp_mod(key: bytes, mod_revision: int) -> Compare:
    """key's mod_revision == mod_revision (0 means: the key is absent)."""
    return Compare(key, "mod", "==", mod_revision)


def cmp_value(key: bytes, value: bytes) -> Compare:
    return Compare(key, "value", "==", value)


def cmp_absent(key: bytes) -> Compare:
    return Compare(key, "create", "==", 0)


def cmp_exists(key: bytes) -> Compare:
    return Compare(key, "create", ">", 0)


def cmp_create(key: bytes, create_revision: int) -> Compare:
    """key's create_revision == create_revision (identifies one incarnation of a key)."""
    return Compare(key, "create", "==", create_revision)


def cmp_lease(key: bytes, lease_id: int) -> Compare:
    """key is attached to lease `lease_id` (etcd >= 3.3)."""
    return Compare(key, "lease", "==", lease_id)



class KeyValueStore(Protocol):
    """What the engine needs from the store (implemented by store.client.Store)."""

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = (), what: str = "write") -> TxnResult: ...

    async def read(self, ops: Sequence[Get], what: str = "read") -> TxnResult: ...

    async def get(self, key: bytes, what: str = "read") -> KeyValue | None: ...

    async def get_many(self, keys: Iterable[bytes], what: str = "read"
                       ) -> dict[bytes, KeyValue | None]: ...

    def pages(self, prefix: bytes, *, start: bytes | None = None, page_size: int = 256,
              what: str = "read", keys_only: bool = False
              ) -> AsyncIterator[list[KeyValue]]: ...

    async def count(self, prefix: bytes, what: str = "read") -> int: ...

    async def grant_lease(self, ttl_s: int, what: str = "lease") -> tuple[int, int]: ...

    async def refresh_lease(self, lease_id: int, *, timeout: float | None = None,
                            what: str = "lease") -> int: ...
