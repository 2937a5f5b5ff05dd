"""A leader lease on one etcd key, with fencing: who may run a singleton background job.

Why this module exists: the outbox dispatcher and the idle-transaction reaper must each
run on one replica at a time (SPEC §2, §6). An etcd lease alone is not mutual exclusion:
a holder paused past its TTL (GC, VM stall, partition) wakes up still believing it leads
(Jepsen, etcd 3.4.3). So leadership here has two halves:

* Local: `is_leader` turns False as soon as a keepalive fails or the lease's *local*
  deadline passes (monotonic clock, granted TTL minus a safety margin, measured from
  before the request that granted/refreshed it). A replica therefore stops acting before
  etcd can expire its key and hand the role to someone else, and it only acts again
  after a fresh `campaign()` wins.
* Server-side: `fence()` returns compares — key value is our holder id, key
  create_revision is the one our campaign produced, key lease is our lease id — that go
  into EVERY etcd transaction made on the strength of the lease. A stale ex-holder's
  writes then fail in etcd itself, whatever its local clock believes. `fenced_txn` does
  this for you and tells a lost fence apart from the caller's own compares failing.

What it must never do: extend a lost term (a failed keepalive is final for that lease;
we revoke it best-effort and campaign afresh), or act on a key it did not create.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from ..errors import StoreError
from ..observability.metrics import METRICS
from .client import (
    Compare,
    Op,
    Store,
    TxnResult,
    cmp_absent,
    cmp_create,
    cmp_lease,
    cmp_value,
    op_get,
    op_put,
)

log = logging.getLogger(__name__)


class NotLeader(StoreError):
    """This replica does not (or no longer) hold the lease; it must stop acting."""


class LeaderLease:
    """Leadership of `key` for `holder_id`, kept alive in the background.

    Usage::

        lease = LeaderLease(store, b"/agenttx/leader/reaper", replica_id, ttl_s=10)
        if await lease.campaign():
            while lease.is_leader:
                await lease.fenced_txn([cmp_mod(k, rev)], [op_delete(k)])
        await lease.resign()
    """

    def __init__(self, store: Store, key: bytes, holder_id: str, ttl_s: int = 10,
                 *, margin_s: float | None = None, role: str = "") -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be >= 1")
        self._store = store
        self.key = key
        self.holder_id = holder_id
        self.ttl_s = int(ttl_s)
        # Safety margin between our local deadline and etcd's expiry: covers clock-rate
        # drift and the time a paused process needs to notice. 20% of the TTL, >= 0.25 s.
        self._margin = margin_s if margin_s is not None else max(0.25, 0.2 * ttl_s)
        self._lease_id: int | None = None
        self._create_revision: int | None = None
        self._deadline = 0.0
        self._held = False
        self._keepalive_task: asyncio.Task[None] | None = None
        self.role = role  # the agenttx_leader{role} gauge, when set

    # ---- state -------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True only while the term is live and its local deadline has not passed."""
        return self._held and time.monotonic() < self._deadline

    @property
    def lease_id(self) -> int | None:
        return self._lease_id

    @property
    def create_revision(self) -> int | None:
        """The revision at which our campaign created the key (the fencing token)."""
        return self._create_revision

    def fence(self) -> list[Compare]:
        """Compares to add to every etcd txn made on the strength of this lease.

        Raises NotLeader when the local term is over: the caller must stop acting.
        """
        if not self.is_leader or self._lease_id is None or self._create_revision is None:
            raise NotLeader(f"not the holder of {self.key.decode(errors='replace')}")
        return [
            cmp_value(self.key, self.holder_id.encode()),
            cmp_create(self.key, self._create_revision),
            cmp_lease(self.key, self._lease_id),
        ]

    async def fenced_txn(self, compare: Sequence[Compare], success: Sequence[Op],
                         failure: Sequence[Op] | None = None, what: str = "fenced write"
                         ) -> TxnResult:
        """One etcd txn guarded by `compare` + the fence.

        Returns the result when the caller's compares decided it (succeeded or not); if
        the fence itself failed the term is over: raises NotLeader (and is_leader is
        False from then on). The key's state is read in the failure branch (its response
        is appended after the caller's failure responses), so this costs no extra trip.
        """
        fence = self.fence()
        res = await self._store.txn(
            [*compare, *fence], success, [*(failure or []), op_get(self.key)], what=what
        )
        if res.succeeded:
            return res
        kv = res.first(len(res.results) - 1)
        holds = kv is not None and (
            kv.value == self.holder_id.encode()
            and kv.create_revision == self._create_revision
            and kv.lease == self._lease_id
        )
        if not holds:
            self._lose("fence failed: the key changed hands or expired")
            raise NotLeader(f"lost {self.key.decode(errors='replace')} (fenced write refused)")
        return TxnResult(res.succeeded, res.revision, res.results[:-1])

    # ---- lifecycle ---------------------------------------------------------------------

    async def campaign(self) -> bool:
        """Try once to become the holder. True if we hold it (now or already).

        Raises StoreUnavailable / StoreError when etcd cannot be asked.
        """
        if self.is_leader:
            return True
        await self._end_term()
        started = time.monotonic()
        lease_id, granted = await self._store.grant_lease(self.ttl_s, what="leader campaign")
        try:
            res = await self._store.txn(
                [cmp_absent(self.key)],
                [op_put(self.key, self.holder_id.encode(), lease=lease_id)],
                what="leader campaign",
            )
        except BaseException:
            # The put may or may not have applied; revoking the lease removes it either way.
            await self._revoke(lease_id)
            raise
        if not res.succeeded:
            await self._revoke(lease_id)
            return False
        self._lease_id = lease_id
        self._create_revision = res.revision
        self._deadline = started + granted - self._margin
        self._held = True
        self._gauge(1)
        self._keepalive_task = asyncio.create_task(
            self._keepalive(lease_id, granted), name=f"lease-keepalive:{self.key.decode()}"
        )
        log.info("leadership acquired", extra={**self._log_fields(), "lease": f"{lease_id:x}",
                                               "revision": res.revision, "ttl_s": granted})
        return True

    async def resign(self) -> None:
        """Stop acting now and release the key (revoking the lease deletes it).

        Never raises for an etcd failure: the lease then simply expires after its TTL.
        """
        was_leader = self.is_leader
        await self._end_term()
        if was_leader:
            log.info("leadership resigned", extra=self._log_fields())

    # ---- internals ---------------------------------------------------------------------

    def _log_fields(self) -> dict[str, Any]:
        return {"leader_key": self.key.decode(errors="replace"), "holder": self.holder_id}

    def _gauge(self, value: int) -> None:
        if self.role:
            METRICS.leader.labels(self.role).set(value)

    def _lose(self, reason: str) -> None:
        if self._held:
            log.warning("leadership lost", extra={**self._log_fields(), "reason": reason})
        self._held = False
        self._gauge(0)

    async def _end_term(self) -> None:
        self._held = False
        self._gauge(0)
        task, self._keepalive_task = self._keepalive_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is not None:
            await self._revoke(lease_id)

    async def _revoke(self, lease_id: int) -> None:
        try:
            await asyncio.wait_for(self._store.client.revoke_lease(lease_id),
                                   timeout=max(1.0, self.ttl_s / 2))
        except Exception as exc:  # best effort: an unrevoked lease expires on its own
            log.info("lease revoke failed; it will expire on its own",
                     extra={**self._log_fields(), "lease": f"{lease_id:x}",
                            "error": type(exc).__name__})

    async def _keepalive(self, lease_id: int, ttl: int) -> None:
        interval = max(0.1, ttl / 3)
        while True:
            await asyncio.sleep(interval)
            if not self.is_leader:
                self._lose("local deadline passed before a keepalive succeeded")
                return
            sent = time.monotonic()
            try:
                reply = await asyncio.wait_for(
                    self._store.client.refresh_lease(lease_id),
                    timeout=max(0.05, self._deadline - sent),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._lose(f"keepalive failed: {type(exc).__name__}")
                await self._revoke(lease_id)
                return
            if reply is None or int(reply.TTL) <= 0:
                self._lose("lease expired or revoked in etcd")
                return
            if self._held:
                self._deadline = sent + int(reply.TTL) - self._margin
