"""A transaction's history: one entry per step sent, and how it ended (GetTransactionHistory).

Why it exists: an agent, and a person, must be able to see what happened to a
transaction after it ended (committed, aborted by the planner or a person, expired), not
only "not found" (docs/client.md, "History").

How it stays cheap (docs/architecture.md, "Round-trip budget"): nothing here makes a
round trip of its own. Each entry is ONE small key, `hist/<id>/s/<seq>`, put by the very
etcd transaction that records the step's outcome (its seq is a counter in the header,
which that transaction compares anyway); the end record `hist/<id>/h` is put by the
transaction that ends it (commit, abort, expiry). Arguments and outputs are cut to
`TEXT_BYTES`, so an entry is small whatever the step carried, and step 500's entry costs
what step 1's does.

Retention without a sweeper: every history key is put with a lease shared by the keys
written in one time bucket (`commit.RetentionLease`, `--history-retention-s`); etcd
deletes them when it expires. A transaction's entries all go on one lease, pinned in
its header by its first entry (`TxHeader.history_lease`), and the reaper keeps alive
the pinned leases of open transactions (`PinnedLeases`): an open transaction's history
never expires, and an ended one's lease stops being refreshed and expires at least
`--history-retention-s` later. The end record goes on the current bucket's lease. One
stuck transaction keeps alive only the lease it shares with the few transactions that
pinned the same one, never the history written after it.

What it must never do: grow a key per transaction (a document appended to), or read
anything but the one transaction's keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from ..contracts.layout import Keys
from ..store.ops import Get, KeyValueStore, Put, prefix_end
from .state import TxHeader, decode_header, from_json, to_json

log = logging.getLogger(__name__)

# docs/client.md, "History": arguments and output at most 4096 bytes of UTF-8 each; a
# longer text is cut and ends with "…" (the 4096 include it).
TEXT_BYTES = 4096
ELLIPSIS = "…"
# Reasons (RollbackTransaction's, an abort's) are kept to the same size.
REASON_BYTES = TEXT_BYTES
# Entries read with the end record and the header in the first round trip.
FIRST_PAGE = 256
# Per-entry framing in a TransactionHistory response (ids, enums, tags, time).
ENTRY_OVERHEAD = 64
# An entry of a step whose texts had to be shortened to fit the response: at least this.
MIN_TEXT_BYTES = 64

# Transaction statuses once ended (docs/client.md): the end record's `status`.
COMMITTED = "COMMITTED"
ABORTED = "ABORTED"
EXPIRED = "EXPIRED"
REJECTED = "REJECTED"      # an approver rejected it, or its approval timed out


def truncate_utf8(text: str, limit: int = TEXT_BYTES) -> str:
    """`text` if its UTF-8 fits in `limit` bytes, else its longest prefix that fits
    together with "…" (never a cut character)."""
    if len(text) * 4 <= limit:  # a character is at most 4 bytes: fits, nothing to encode
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    room = max(0, limit - len(ELLIPSIS.encode()))
    return raw[:room].decode("utf-8", "ignore") + ELLIPSIS


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One step sent: what was asked, what came of it."""

    step_id: int
    tool: str
    status: str             # SUCCESS | ROLLBACK_TRIGGERED | FAILED
    category: str
    hint: str
    strategy: str           # planner.Strategy value: NONE, LOCAL_BACKTRACK, ...
    at: float               # unix seconds
    arguments_json: str     # at most TEXT_BYTES
    output_json: str        # at most TEXT_BYTES; "" for a failed step

    @classmethod
    def of(cls, step_id: int, tool: str, status: str, *, arguments_json: str,
           output_json: str = "", category: str = "", hint: str = "",
           strategy: str = "NONE") -> HistoryEntry:
        return cls(step_id, tool, status, category, hint, strategy, time.time(),
                   truncate_utf8(arguments_json), truncate_utf8(output_json))


@dataclass(frozen=True, slots=True)
class Ending:
    """How a transaction ends, decided by whoever ends it."""

    status: str             # COMMITTED | ABORTED | EXPIRED | REJECTED
    ended_by: str           # the principal ("" without authentication), or "reaper"
    reason: str = ""

    def cut(self) -> Ending:
        return Ending(self.status, self.ended_by, truncate_utf8(self.reason, REASON_BYTES))


@dataclass(frozen=True, slots=True)
class HistoryEnd:
    """hist/<id>/h: the ended transaction's header, as GetTransactionHistory reports it."""

    status: str
    agent_id: str
    principal: str
    created_at: float
    ended_at: float
    ended_by: str
    reason: str
    steps_committed: int = 0
    effects: int = 0


# ---- codec ----------------------------------------------------------------------------

def encode_entry(e: HistoryEntry) -> bytes:
    return to_json([e.step_id, e.tool, e.status, e.category, e.hint, e.strategy, e.at,
                    e.arguments_json, e.output_json])


def decode_entry(raw: bytes) -> HistoryEntry:
    d = from_json(raw)
    return HistoryEntry(int(d[0]), d[1], d[2], d[3], d[4], d[5], float(d[6]), d[7], d[8])


def encode_end(e: HistoryEnd) -> bytes:
    return to_json({"st": e.status, "ag": e.agent_id, "pr": e.principal, "ca": e.created_at,
                    "ea": e.ended_at, "eb": e.ended_by, "re": e.reason,
                    "sc": e.steps_committed, "fx": e.effects})


def decode_end(raw: bytes) -> HistoryEnd:
    d = from_json(raw)
    return HistoryEnd(d["st"], d["ag"], d["pr"], float(d["ca"]), float(d["ea"]), d["eb"],
                      d["re"], int(d["sc"]), int(d["fx"]))


# ---- writing: Puts folded into the transactions that change the state ----------------

class HistoryWriter:
    """Builds the history Puts a state change folds into its own etcd transaction."""

    def __init__(self, keys: Keys, lease_id: Callable[[], Awaitable[int]]) -> None:
        self.keys = keys
        self._lease_id = lease_id

    async def entry(self, header: TxHeader, entry: HistoryEntry) -> tuple[Put, TxHeader]:
        """The Put of the transaction's next entry, and `header` as it must be written
        with it: the entry counted, the lease pinned."""
        lease = header.history_lease or await self._lease_id()
        put = Put(self.keys.history_step(header.id, header.history_seq), encode_entry(entry),
                  lease=lease)
        # one copy of the header (a step is on the hot path: docs/benchmarks.md)
        return put, replace(header, history_lease=lease, history_seq=header.history_seq + 1)

    def rewrite(self, header: TxHeader, seq: int, entry: HistoryEntry) -> Put:
        """The Put that writes (again) entry `seq`, on the header's pinned lease."""
        return Put(self.keys.history_step(header.id, seq), encode_entry(entry),
                   lease=header.history_lease)

    async def end(self, header: TxHeader, ending: Ending, *, steps_committed: int = 0,
                  effects: int = 0) -> Put:
        ending = ending.cut()
        record = HistoryEnd(ending.status, header.agent_id, header.principal,
                            header.created_at, time.time(), ending.ended_by, ending.reason,
                            steps_committed, effects)
        return Put(self.keys.history_end(header.id), encode_end(record),
                   lease=await self._lease_id())


# ---- reading ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Recorded:
    """What etcd holds for one transaction's history, read at one revision."""

    header: TxHeader | None
    end: HistoryEnd | None
    entries: list[HistoryEntry]


async def read(store: KeyValueStore, keys: Keys, tx_id: str) -> Recorded:
    """The transaction's header (open) or end record (ended) and its entries: one round
    trip for up to FIRST_PAGE entries, then pages."""
    prefix = keys.history_steps_prefix(tx_id)
    res = await store.read([Get(keys.tx_header(tx_id)), Get(keys.history_end(tx_id)),
                            Get(prefix, prefix_end(prefix), FIRST_PAGE + 1)],
                           what="get history")
    header_kv, end_kv, page = res.first(0), res.first(1), res.kvs(2)
    entries = [decode_entry(kv.value) for kv in page[:FIRST_PAGE]]
    if len(page) > FIRST_PAGE:
        async for more in store.pages(prefix, start=page[FIRST_PAGE - 1].key + b"\x00",
                                      what="get history"):
            entries += [decode_entry(kv.value) for kv in more]
    return Recorded(decode_header(header_kv.value) if header_kv is not None else None,
                    decode_end(end_kv.value) if end_kv is not None else None, entries)


def fit(entries: Sequence[HistoryEntry], budget: int) -> list[HistoryEntry]:
    """The entries as one response can carry them (docs/architecture.md, "Every answer
    fits"): as stored when they fit in `budget` bytes; else every entry with its texts
    cut evenly shorter; and when even short entries do not fit, the most recent ones."""
    def size(e: HistoryEntry, texts: int | None = None) -> int:
        fixed = ENTRY_OVERHEAD + len(e.tool) + len(e.category) + len(e.hint.encode())
        if texts is None:
            return fixed + len(e.arguments_json.encode()) + len(e.output_json.encode())
        return fixed + 2 * texts

    if sum(size(e) for e in entries) <= budget:
        return list(entries)
    fixed = sum(size(e, 0) for e in entries)
    per_text = (budget - fixed) // (2 * len(entries)) if entries else 0
    if per_text >= MIN_TEXT_BYTES:
        return [_shortened(e, per_text) for e in entries]
    kept: list[HistoryEntry] = []
    used = 0
    for e in reversed(entries):
        cost = size(e, MIN_TEXT_BYTES)
        if used + cost > budget:
            break
        kept.append(_shortened(e, MIN_TEXT_BYTES))
        used += cost
    return kept[::-1]


def history_header_bytes(view: object) -> int:
    """What a TransactionHistory response needs besides its steps (ids, texts, framing)."""
    return 256 + sum(len(str(v).encode()) for v in vars(view).values()
                     if isinstance(v, str))


def _shortened(e: HistoryEntry, limit: int) -> HistoryEntry:
    return HistoryEntry(e.step_id, e.tool, e.status, e.category, e.hint, e.strategy, e.at,
                        truncate_utf8(e.arguments_json, limit),
                        truncate_utf8(e.output_json, limit))


# ---- retention --------------------------------------------------------------------------

class PinnedLeases:
    """Keeps alive the history leases open transactions have pinned (see the module
    docstring). Run by the reaper's leader on each of its sweeps, which read every
    open header anyway; a refresh is sent at most every half bucket per lease."""

    def __init__(self, store: KeyValueStore, bucket_s: float) -> None:
        self.store, self.bucket_s = store, bucket_s
        self._refreshed: dict[int, float] = {}

    async def keep_alive(self, pinned: set[int]) -> int:
        """Refresh the leases in `pinned` that are due; returns how many were sent."""
        now = time.monotonic()
        sent = 0
        for lease in sorted(pinned - {0}):
            if now - self._refreshed.get(lease, 0.0) < self.bucket_s / 2:
                continue
            if await self.store.refresh_lease(lease, what="lease history") <= 0:
                log.warning("the history lease of an open transaction is gone",
                            extra={"lease": lease})
            self._refreshed[lease] = now
            sent += 1
        self._refreshed = {k: v for k, v in self._refreshed.items() if k in pinned}
        return sent


__all__ = ["ABORTED", "COMMITTED", "ELLIPSIS", "EXPIRED", "REJECTED", "Ending", "HistoryEnd",
           "HistoryEntry", "HistoryWriter", "PinnedLeases", "Recorded", "TEXT_BYTES", "fit",
           "history_header_bytes", "read", "truncate_utf8"]
