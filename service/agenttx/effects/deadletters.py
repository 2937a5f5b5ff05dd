"""Dead letters for admins: list them, send one again, or drop one with a reason.

Why this module exists: a delivery its receiver refused for good (effects.delivery) is
not retried by the dispatcher; it waits at `<prefix>/deadletters/<owner>/<key>` until a
person decides (docs/operations.md, "Dead letters"). Those decisions are the
`ListDeadLetters`, `RetryDeadLetter` and `DiscardDeadLetter` RPCs (admins only; the
servicer checks) and `agenttx effects dead | retry | discard`.

Each decision is ONE etcd transaction guarded by the letter's mod_revision, and keeps the
idempotency key's reservation (`<prefix>/effkeys/<owner>/<key>`) consistent:

* retry: the letter goes back to its outbox key (`Keys.outbox(tx, seq)`, unclaimed and
  due now, attempts and last error kept) with the SAME idempotency key, and the key is
  reserved for the retention window again (as a commit does); the dispatcher leader
  picks it up within one poll interval;
* discard: the letter is deleted and the key stays reserved for the retention window,
  exactly as after a delivery: it cannot be reused by mistake right away.

A lost compare is never retried blindly: the letter is read again and the decision made
on what is there now (gone: NOT_FOUND). Listing reads the letters in small pages (each
carries its payload, up to 1 MiB), so its cost is bounded by the page asked for.

What it must never do: deliver anything itself, or drop a letter it was not asked to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from ..contracts.layout import Keys
from ..contracts.outbox import (
    DeadLetter,
    decode_dead_letter,
    encode_entry,
    reservation_value,
)
from ..errors import FailedPrecondition, InvalidArgument, NotFound
from ..store.client import KeyValue, Store, cmp_absent, cmp_mod, op_delete, op_get, op_put

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# Letters read from etcd per round trip while listing: each may carry 1 MiB of payload.
_READ_PAGE = 16
# Re-reads after a lost compare before answering FAILED_PRECONDITION.
_DECIDE_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """One dead letter as ListDeadLetters shows it (no payload: admins see where it went,
    why it failed and how often; the payload stays in etcd)."""

    idempotency_key: str
    principal: str
    transaction_id: str
    kind: str
    channel: str            # the effect's channel, or the deferred call's tool
    last_error: str
    attempts: int
    dead_at: float


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    letters: list[DeadLetterInfo]
    next_page_token: str


def _shown(key: str) -> str:
    """A key as messages show it: JSON-quoted, ASCII only (old letters may hold keys with
    invisible characters, from before keys were checked at staging)."""
    return json.dumps(key)


class DeadLetters:
    """The dead letters of one deployment (one etcd prefix)."""

    def __init__(self, store: Store, keys: Keys,
                 retention_lease: Callable[[], Awaitable[int]]) -> None:
        self.store = store
        self.keys = keys
        # The lease a reservation kept "for the retention window" is put on (the same
        # shared lease commits use: engine.commit.RetentionLease).
        self.retention_lease = retention_lease

    # ---- reading ---------------------------------------------------------------------

    def _info(self, kv: KeyValue) -> DeadLetterInfo:
        owner, idem = self.keys.dead_letter_parts(kv.key)
        try:
            letter = decode_dead_letter(kv.value)
        except ValueError as exc:  # shown, never hidden: an admin may discard it
            return DeadLetterInfo(idem, owner, "", "", "", f"unreadable dead letter: {exc}",
                                  0, 0.0)
        e = letter.entry
        return DeadLetterInfo(e.idempotency_key, e.owner, e.transaction_id, e.kind, e.target,
                              e.last_error, e.attempts, letter.dead_at)

    async def list(self, page_size: int = 0, page_token: str = "") -> DeadLetterPage:
        """Dead letters in key order (principal, then idempotency key), `page_size` at a
        time (0: 100; at most 1000). `page_token` continues after the last letter of
        the previous page."""
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        try:
            start = self.keys.dead_letters_after(page_token) if page_token else None
        except ValueError:
            raise InvalidArgument("page_token is not a token this service handed out") from None
        out: list[DeadLetterInfo] = []
        last = b""
        more = False
        async for page in self.store.pages(self.keys.dead_letters_prefix(), start=start,
                                           page_size=min(_READ_PAGE, size + 1),
                                           what="outbox dead letters"):
            for kv in page:
                if len(out) == size:
                    more = True
                    break
                out.append(self._info(kv))
                last = kv.key
            if more:
                break
        return DeadLetterPage(out, self.keys.dead_letter_token(last) if more else "")

    async def count(self) -> int:
        return await self.store.count(self.keys.dead_letters_prefix(),
                                      what="outbox dead letters")

    async def _find(self, idempotency_key: str, principal: str) -> KeyValue:
        """The letter of `idempotency_key` (of `principal` when given, else of whichever
        principal holds one: keys are unique per principal, so several may)."""
        if principal:
            candidates = [self.keys.dead_letter(principal, idempotency_key)]
        else:
            candidates = []
            async for page in self.store.pages(self.keys.dead_letters_prefix(),
                                               page_size=1000, keys_only=True,
                                               what="outbox dead letters"):
                candidates += [kv.key for kv in page
                               if self.keys.dead_letter_parts(kv.key)[1] == idempotency_key]
        if len(candidates) > 1:
            owners = ", ".join(_shown(self.keys.dead_letter_parts(k)[0]) for k in candidates)
            raise FailedPrecondition(
                f"idempotency key {_shown(idempotency_key)} is a dead letter of several "
                f"principals ({owners}); pass principal to say which")
        kv = await self.store.get(candidates[0], what="outbox dead letter read") \
            if candidates else None
        if kv is None:
            whose = f" of principal {_shown(principal)}" if principal else ""
            raise NotFound(f"no dead letter with idempotency key {_shown(idempotency_key)}"
                           f"{whose}")
        return kv

    # ---- deciding ------------------------------------------------------------------------

    async def retry(self, idempotency_key: str, principal: str = "") -> DeadLetter:
        """Put the letter back into the outbox, same idempotency key, due now."""
        for _ in range(_DECIDE_ATTEMPTS):
            kv = await self._find(idempotency_key, principal)
            try:
                letter = decode_dead_letter(kv.value)
            except ValueError as exc:
                raise FailedPrecondition(
                    f"dead letter {_shown(idempotency_key)} is unreadable ({exc}); it cannot "
                    "be sent again, only discarded") from None
            e = letter.entry
            back = replace(e, next_attempt_at=time.time(), claimed_by="", claim_until=0.0)
            okey = self.keys.outbox(e.transaction_id, e.seq)
            rkey = self.keys.effect_key(e.owner, e.idempotency_key)
            lease = await self.retention_lease()
            res = await self.store.txn(
                [cmp_mod(kv.key, kv.mod_revision), cmp_absent(okey)],
                [op_delete(kv.key), op_put(okey, encode_entry(back)),
                 op_put(rkey, reservation_value(e.transaction_id, 0, "committed"),
                        lease=lease)],
                [op_get(okey)], what="outbox dead letter retry")
            if res.succeeded:
                return letter
            if res.first(0) is not None:
                raise FailedPrecondition(
                    f"dead letter {_shown(idempotency_key)} cannot go back to the outbox: "
                    f"its outbox entry {okey.decode(errors='replace')} exists already")
            # the letter changed under us: read it again and decide on what is there now
        raise FailedPrecondition(f"dead letter {_shown(idempotency_key)} kept changing "
                                 "concurrently; try again")

    async def discard(self, idempotency_key: str, principal: str = "") -> DeadLetter | None:
        """Delete the letter; its key stays reserved for the retention window. Returns
        the letter (None if it was unreadable)."""
        for _ in range(_DECIDE_ATTEMPTS):
            kv = await self._find(idempotency_key, principal)
            try:
                letter: DeadLetter | None = decode_dead_letter(kv.value)
            except ValueError:
                letter = None
            owner, idem = self.keys.dead_letter_parts(kv.key)
            tx = letter.entry.transaction_id if letter is not None else ""
            lease = await self.retention_lease()
            res = await self.store.txn(
                [cmp_mod(kv.key, kv.mod_revision)],
                [op_delete(kv.key),
                 op_put(self.keys.effect_key(owner, idem),
                        reservation_value(tx, 0, "discarded"), lease=lease)],
                what="outbox dead letter discard")
            if res.succeeded:
                return letter
        raise FailedPrecondition(f"dead letter {_shown(idempotency_key)} kept changing "
                                 "concurrently; try again")


__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "DeadLetterInfo", "DeadLetterPage",
           "DeadLetters"]
