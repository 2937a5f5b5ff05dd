"""The benchmark's picture of a final state, and its canonical, hashable form.

Why one module: the oracle compares what a run left behind (read back from etcd, the
sandbox and the webhook receiver's log) with what the task should have left (computed by
the pure model in `oracle`). Both sides must be the same data type, reduced to the same
canonical JSON, or the comparison would measure the encoding instead of the outcome.

Every run works in its own namespace: a prefix such as ``run0007/`` on every kv key,
record id, file path and idempotency key it touches. The canonical form strips that
prefix from every string, so two runs of one task compare equal when their outcomes do.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# One entry of the state: ("kv", key) | ("row", table, id) | ("file", path) | ("effect", key)
Item = tuple[str, ...]


@dataclass(frozen=True)
class Delivered:
    """An effect as the receiver saw it: channel, and the payload of every confirmed
    delivery of its idempotency key, in arrival order (two entries = a duplicate)."""

    channel: str
    payloads: tuple[Any, ...]


@dataclass
class State:
    """kv values, record rows (string ids), file contents and delivered effects."""

    kv: dict[str, Any] = field(default_factory=dict)
    rows: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    effects: dict[str, Delivered] = field(default_factory=dict)

    def copy(self) -> State:
        return State(json.loads(json.dumps(self.kv)),
                     {k: json.loads(json.dumps(v)) for k, v in self.rows.items()},
                     dict(self.files), dict(self.effects))

    def items(self) -> Iterator[tuple[Item, Any]]:
        """Every entry as (item, comparable value)."""
        for key, value in self.kv.items():
            yield ("kv", key), value
        for (table, rid), fields in self.rows.items():
            yield ("row", table, rid), fields
        for path, contents in self.files.items():
            yield ("file", path), contents
        for key, eff in self.effects.items():
            yield ("effect", key), {"channel": eff.channel, "payloads": list(eff.payloads)}

    def as_map(self) -> dict[Item, Any]:
        return dict(self.items())


def strip_namespace(value: Any, ns: str) -> Any:
    """`value` with `ns` removed from every string in it (keys included)."""
    if not ns:
        return value
    if isinstance(value, str):
        return value.replace(ns, "")
    if isinstance(value, list | tuple):
        return [strip_namespace(v, ns) for v in value]
    if isinstance(value, dict):
        return {strip_namespace(k, ns): strip_namespace(v, ns) for k, v in value.items()}
    return value


def canonical(state: State, ns: str = "") -> dict[str, Any]:
    """The state as plain JSON-able data with the run's namespace stripped."""
    doc = {
        "kv": dict(state.kv),
        "rows": {f"{table}/{json.dumps(rid, ensure_ascii=False)}": fields
                 for (table, rid), fields in state.rows.items()},
        "files": dict(state.files),
        "effects": {key: {"channel": eff.channel, "payloads": list(eff.payloads)}
                    for key, eff in state.effects.items()},
    }
    out = strip_namespace(doc, ns)
    assert isinstance(out, dict)
    return out


def canonical_json(state: State, ns: str = "") -> str:
    return json.dumps(canonical(state, ns), sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))


def digest(state: State, ns: str = "") -> str:
    """sha256 of the canonical JSON: equal digests, equal outcomes."""
    return hashlib.sha256(canonical_json(state, ns).encode("utf-8")).hexdigest()
