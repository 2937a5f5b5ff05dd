"""The outbox entry and the dead letter: typed records with ONE codec (docs/operations.md).

Why here, below the engine: the engine's commit writes outbox entries in the same etcd
transaction as the data, and the dispatcher (`agenttx.effects`) claims, delivers,
reschedules and buries them; the two must agree on one record without the engine
importing the effects package (import-linter holds that). So the record, its codec and
the rule for idempotency keys live in this small module both import.

An entry is one committed thing to send after commit:

* `kind = "effect"`: an `effect.stage` effect: `channel` names a configured channel,
  `payload` is what it sends;
* `kind = "deferred"`: a toolset tool staged at step time and called at commit (docs/
  toolsets.md): `tool` is the AgentTx tool name (`<prefix>.<tool>`), `toolset` its
  `<namespace>/<name>` and `arguments` the resolved arguments. The dispatcher routes
  on `kind`; `target` names the destination for people either way.

Both carry the idempotency key the receiver dedupes on, the transaction that committed
them and the `owner` (principal, "" without authentication) whose key space the key
belongs to (`Keys.effect_key`, `Keys.dead_letter`).

Encoded once when the commit builds it and after that only when a state change writes
it again (claim, reschedule, burial, retry); the committing replica delivers from the
typed record it wrote, never from a decode of its own bytes. The JSON keeps readable
field names: operators read entries with etcdctl (docs/operations.md, "Outbox backlog").

Pure: no I/O, no clock (callers pass `now`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

KIND_EFFECT = "effect"
KIND_DEFERRED = "deferred"
KINDS = (KIND_EFFECT, KIND_DEFERRED)

# Idempotency keys an agent gives (docs/tools.md, effect.stage): 1-200 printable ASCII
# characters, so every accepted key fits an HTTP header (RFC 9110 field values) and a
# mail header unchanged. Generated keys satisfy the same rule.
IDEMPOTENCY_KEY_MAX_CHARS = 200
IDEMPOTENCY_KEY_RULE = (f"1 to {IDEMPOTENCY_KEY_MAX_CHARS} printable ASCII characters "
                        "(`!` to `~`)")

# A deferred toolset call is staged at step time like an effect, on this pseudo-channel
# + "<namespace>/<name>" of its toolset (no configured channel can be named so: channel
# names match [A-Za-z0-9][A-Za-z0-9_.-]*); the commit turns it into a `deferred` entry.
DEFERRED_CHANNEL = "toolset:"

# last_error is for people; it is kept short so an entry stays small.
MAX_ERROR_CHARS = 500


def idempotency_key_problem(key: str) -> str | None:
    """Why `key` cannot be an idempotency key, worded as serde words a bad value (the
    caller prefixes the argument path so the hint names it); None when it can.

    The value is shown JSON-escaped (ASCII only): a key made of invisible or
    bidirectional-override characters must not reach a hint, a log line or a terminal
    as those characters."""
    if not key or len(key) > IDEMPOTENCY_KEY_MAX_CHARS:
        return f"invalid length {len(key)}, expected {IDEMPOTENCY_KEY_RULE}"
    if all("!" <= ch <= "~" for ch in key):
        return None
    return f"invalid value: string {json.dumps(key)}, expected {IDEMPOTENCY_KEY_RULE}"


def reservation_value(tx_id: str, step_id: int, state: str) -> bytes:
    """The value of an idempotency key's reservation (`Keys.effect_key`): which
    transaction holds it and why (`staged`, `committed`, `dead`, `discarded`). Only its
    existence is checked; the value is for people reading etcd."""
    return json.dumps({"tx": tx_id, "step": step_id, "state": state},
                      separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """`<prefix>/outbox/<tx>/<seq>`: a committed effect or deferred call not yet
    confirmed delivered, with its delivery bookkeeping."""

    kind: str
    idempotency_key: str
    transaction_id: str
    seq: int
    created_at: float
    owner: str = ""
    channel: str = ""                 # effect: the configured channel
    payload: Any = None               # effect: what the channel sends
    tool: str = ""                    # deferred: the AgentTx tool, "<prefix>.<tool>"
    toolset: str = ""                 # deferred: "<namespace>/<name>"
    arguments: Any = None             # deferred: the resolved arguments
    attempts: int = 0                 # every delivery attempt so far, failed ones
    next_attempt_at: float = 0.0      # unix seconds; due from then on
    claimed_by: str = ""              # replica delivering it now ("" = nobody)
    claim_until: float = 0.0          # unix seconds; the claim lapses then
    last_error: str = ""

    @property
    def target(self) -> str:
        """Where it goes, as a person names it: the channel, or the deferred tool."""
        return self.tool if self.kind == KIND_DEFERRED else self.channel

    def is_due(self, now: float) -> bool:
        """Its backoff has run out and nobody holds a live claim on it."""
        if self.next_attempt_at > now:
            return False
        return not self.claimed_by or self.claim_until <= now

    def claimed(self, replica_id: str, until: float) -> OutboxEntry:
        return replace(self, claimed_by=replica_id, claim_until=until)

    def failed(self, error: str, retry_at: float) -> OutboxEntry:
        """After a failed attempt: counted, unclaimed, due again at `retry_at`."""
        return replace(self, attempts=self.attempts + 1, next_attempt_at=retry_at,
                       last_error=error[:MAX_ERROR_CHARS], claimed_by="", claim_until=0.0)


def effect_entry(channel: str, payload: Any, idempotency_key: str, transaction_id: str,
                 seq: int, *, now: float, owner: str = "", claimed_by: str = "",
                 claim_s: float = 0.0) -> OutboxEntry:
    """The entry a commit writes for one staged effect: due now, and with `claimed_by`
    (the committing replica) reserved for its commit-time delivery until `now + claim_s`,
    so the background dispatcher leaves it alone meanwhile."""
    return OutboxEntry(kind=KIND_EFFECT, idempotency_key=idempotency_key,
                       transaction_id=transaction_id, seq=seq, created_at=now, owner=owner,
                       channel=channel, payload=payload, next_attempt_at=now,
                       claimed_by=claimed_by, claim_until=now + claim_s if claimed_by else 0.0)


def deferred_entry(toolset: str, tool: str, arguments: Any, idempotency_key: str,
                   transaction_id: str, seq: int, *, now: float, owner: str = "",
                   claimed_by: str = "", claim_s: float = 0.0) -> OutboxEntry:
    """The entry a commit writes for one staged deferred toolset call (`tool` is the
    AgentTx name, `<prefix>.<upstream tool>`), claimed like `effect_entry`'s."""
    return OutboxEntry(kind=KIND_DEFERRED, idempotency_key=idempotency_key,
                       transaction_id=transaction_id, seq=seq, created_at=now, owner=owner,
                       tool=tool, toolset=toolset, arguments=arguments, next_attempt_at=now,
                       claimed_by=claimed_by, claim_until=now + claim_s if claimed_by else 0.0)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """`<prefix>/deadletters/<owner>/<key>`: an entry its receiver refused permanently,
    with everything needed to send it again (`RetryDeadLetter` puts `entry` back at
    its outbox key, `Keys.outbox(entry.transaction_id, entry.seq)`). `entry.attempts`
    counts every attempt, the refused one included; `entry.last_error` says why."""

    entry: OutboxEntry
    dead_at: float


# ---- codec -----------------------------------------------------------------------------

def _entry_doc(e: OutboxEntry) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": e.kind, "idempotency_key": e.idempotency_key,
        "transaction_id": e.transaction_id, "seq": e.seq, "created_at": e.created_at,
        "owner": e.owner, "attempts": e.attempts, "next_attempt_at": e.next_attempt_at,
        "claimed_by": e.claimed_by, "claim_until": e.claim_until,
        "last_error": e.last_error,
    }
    if e.kind == KIND_DEFERRED:
        doc.update(tool=e.tool, toolset=e.toolset, arguments=e.arguments)
    else:
        doc.update(channel=e.channel, payload=e.payload)
    return doc


def _encode(doc: dict[str, Any]) -> bytes:
    # ensure_ascii: a payload string with a lone surrogate (valid JSON escape, invalid
    # UTF-8) still encodes; the channel decides whether it can send it.
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def encode_entry(entry: OutboxEntry) -> bytes:
    return _encode(_entry_doc(entry))


def _number(doc: dict[str, Any], name: str, default: float = 0.0) -> float:
    value = doc.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"outbox entry field `{name}` is not a number")
    return float(value)


def _text(doc: dict[str, Any], name: str, *, required: bool = False) -> str:
    value = doc.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise ValueError(f"outbox entry field `{name}` is not a string")
    return value


def _entry_of(doc: Any) -> OutboxEntry:
    if not isinstance(doc, dict):
        raise ValueError("outbox entry is not a JSON object")
    kind = doc.get("kind", KIND_EFFECT)      # entries written before kinds existed
    if kind not in KINDS:
        raise ValueError(f"outbox entry kind {kind!r} is not one of {', '.join(KINDS)}")
    entry = OutboxEntry(
        kind=kind, idempotency_key=_text(doc, "idempotency_key", required=True),
        transaction_id=_text(doc, "transaction_id"), seq=int(_number(doc, "seq")),
        created_at=_number(doc, "created_at"), owner=_text(doc, "owner"),
        channel=_text(doc, "channel"), payload=doc.get("payload"),
        tool=_text(doc, "tool"), toolset=_text(doc, "toolset"),
        arguments=doc.get("arguments"), attempts=int(_number(doc, "attempts")),
        next_attempt_at=_number(doc, "next_attempt_at"), claimed_by=_text(doc, "claimed_by"),
        claim_until=_number(doc, "claim_until"), last_error=_text(doc, "last_error"))
    if not entry.target:
        raise ValueError(f"outbox entry of kind {kind} names no "
                         f"{'tool' if kind == KIND_DEFERRED else 'channel'}")
    return entry


def decode_entry(raw: bytes) -> OutboxEntry:
    """Raises ValueError when `raw` is not an entry this codec (or the untyped one before
    it) wrote."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"outbox entry is not JSON: {exc}") from None
    return _entry_of(doc)


def encode_dead_letter(letter: DeadLetter) -> bytes:
    return _encode({**_entry_doc(letter.entry), "dead_at": letter.dead_at})


def decode_dead_letter(raw: bytes) -> DeadLetter:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"dead letter is not JSON: {exc}") from None
    entry = _entry_of(doc)
    return DeadLetter(entry, _number(doc, "dead_at"))


__all__ = [
    "DEFERRED_CHANNEL", "IDEMPOTENCY_KEY_MAX_CHARS", "IDEMPOTENCY_KEY_RULE", "KINDS", "KIND_DEFERRED",
    "KIND_EFFECT", "MAX_ERROR_CHARS", "DeadLetter", "OutboxEntry", "decode_dead_letter",
    "decode_entry", "effect_entry", "encode_dead_letter", "encode_entry",
    "idempotency_key_problem",
    "reservation_value",
]
