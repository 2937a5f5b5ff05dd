"""Per-RPC bookkeeping shared by the layers without coupling them.

The servicer opens an `RpcRecord` for each call; the store counts etcd round trips into
it and the engine adds facts (transaction, step, tool, strategy) to it, so each RPC ends
in ONE structured log line and one set of metric updates, written by the servicer.
A contextvar carries it: each gRPC call runs in its own task, hence its own context.

Nothing here imports grpc, aetcd or the engine.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from .metrics import ETCD_OPERATIONS, METRICS


@dataclass
class RpcRecord:
    etcd_round_trips: int = 0
    fields: dict[str, Any] = field(default_factory=dict)


_CURRENT: contextvars.ContextVar[RpcRecord | None] = contextvars.ContextVar(
    "agenttx_rpc_record", default=None)

# store `what=` strings -> the bounded `operation` label of the etcd metrics.
_OPERATION_OF = {
    "begin": "begin", "step": "step", "step read": "load", "load": "load",
    "commit": "commit", "commit read": "commit", "commit diagnose": "commit",
    "state": "rollback", "undo intent": "rollback", "undo read": "rollback",
    "rollback": "rollback", "get": "get", "list": "list", "touch": "touch",
    "reaper scan": "reaper", "reaper touch": "reaper", "temp sweep": "reaper",
}


def operation_label(what: str) -> str:
    op = _OPERATION_OF.get(what)
    if op is not None:
        return op
    head = what.split(" ", 1)[0]
    if head in ("outbox", "effects"):
        return "outbox"
    if head in ("lease", "leader", "replica"):
        return "lease"
    if head in ("policy", "policies", "publish", "unpublish", "sweep", "load"):
        return "policy"
    if head in ("jwks", "auth"):
        return "auth"
    return head if head in ETCD_OPERATIONS else "other"


def begin_rpc() -> RpcRecord:
    record = RpcRecord()
    _CURRENT.set(record)
    return record


def current() -> RpcRecord | None:
    return _CURRENT.get()


def note(**facts: Any) -> None:
    """Add facts to the current RPC's log line (no-op outside an RPC)."""
    record = _CURRENT.get()
    if record is not None:
        record.fields.update(facts)


# what -> (requests counter, duration histogram): labels() is a lock and a dict lookup
# per call; a round trip happens on every step, so the children are looked up once.
_CHILDREN: dict[str, tuple[Any, Any]] = {}


def count_round_trip(what: str, seconds: float) -> None:
    record = _CURRENT.get()
    if record is not None:
        record.etcd_round_trips += 1
    children = _CHILDREN.get(what)
    if children is None:
        op = operation_label(what)
        children = _CHILDREN[what] = (METRICS.etcd_requests.labels(op),
                                      METRICS.etcd_duration.labels(op))
    children[0].inc()
    children[1].observe(seconds)
