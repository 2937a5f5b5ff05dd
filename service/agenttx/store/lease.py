"""etcd leases: the one keeper that keeps a lease alive (`LeaseKeeper`), and on it a
leader lease on one etcd key, with fencing: who may run a singleton background job.

Why one keeper: a replica's presence key and each leader key live on a lease that must
be granted, refreshed every third of its TTL, re-granted (presence) or given up (a
leader) once it is lost, and revoked on stop; written once here, it is also the only
code outside `client.py` that asks etcd anything about leases.

Why leader leases: the outbox dispatcher and the idle-transaction reaper must each
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
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..errors import StoreError
from ..observability.metrics import METRICS
from ..tasks import BackgroundTasks
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


class LeaseKeeper:
    """One etcd lease, kept alive in the background.

    `acquire()` grants a lease and lets `attach(lease_id)` put keys on it (returning
    False gives the lease back: e.g. a leader key someone else holds). `start()` then
    refreshes it every third of its TTL. The lease is lost when a refresh fails, when
    etcd says it expired, or when its local deadline passes before a refresh succeeded
    (granted TTL minus `margin_s`, measured from before the request: a paused process
    notices before etcd can hand its keys to someone else). What happens then:

    * `regrant=True` (a replica's presence): a new lease is granted and the keys are put
      again (retried every `retry_s` while etcd is unreachable). The lost lease is NOT
      revoked: its keys must not vanish while the process is alive; it expires.
    * `regrant=False` (a leader's term): `on_lost(reason)` is called and the keeper
      stops; a lease whose refresh failed is revoked at once, so its keys go now.

    `stop()` ends the refreshing and revokes the lease (best effort: an unrevoked lease
    expires after its TTL). A loss is reported through `on_lost` when given, else logged.
    """

    def __init__(self, store: Store, ttl_s: int, *, what: str,
                 attach: Callable[[int], Awaitable[bool]] | None = None,
                 regrant: bool = True, margin_s: float = 0.0, retry_s: float = 1.0,
                 on_lost: Callable[[str], None] | None = None) -> None:
        if ttl_s < 1:
            raise ValueError("ttl_s must be >= 1")
        self._store = store
        self.ttl_s = int(ttl_s)
        self.what = what
        self._attach = attach
        self.regrant = regrant
        self._margin = margin_s
        self._retry_s = retry_s
        self._on_lost = on_lost
        self._lease_id: int | None = None
        self._granted = 0
        self._valid_until = 0.0
        self._tasks = BackgroundTasks(what)
        self._task: asyncio.Task[Any] | None = None

    @property
    def lease_id(self) -> int | None:
        return self._lease_id

    @property
    def valid(self) -> bool:
        """True while a lease is held and its local deadline has not passed."""
        return self._lease_id is not None and time.monotonic() < self._valid_until

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The refreshing task, while it runs."""
        return self._task if self._task is not None and not self._task.done() else None

    async def acquire(self) -> bool:
        """Grant a lease and attach the keys; True when held. Raises StoreUnavailable /
        StoreError when etcd cannot be asked (nothing is left behind: a lease granted
        before the failure is revoked)."""
        started = time.monotonic()
        lease_id, granted = await self._store.grant_lease(self.ttl_s, what=self.what)
        try:
            keep = True if self._attach is None else await self._attach(lease_id)
        except BaseException:
            # The keys may or may not have been put; revoking the lease removes them.
            await self._revoke(lease_id)
            raise
        if not keep:
            await self._revoke(lease_id)
            return False
        self._lease_id, self._granted = lease_id, granted
        self._valid_until = started + granted - self._margin
        return True

    def start(self) -> None:
        self._task = self._tasks.start(self._run(), name=f"lease-keepalive:{self.what}")

    async def stop(self) -> None:
        await self._tasks.stop()
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is not None:
            await self._revoke(lease_id)

    async def _run(self) -> None:
        while True:
            if self._lease_id is None:
                try:
                    held = await self.acquire()
                    why = "its keys were not attached"
                except StoreError as exc:
                    held, why = False, str(exc)
                if not held:
                    log.warning("cannot take a lease; retrying",
                                extra={"lease_of": self.what, "error": why,
                                       "retry_in_s": self._retry_s})
                    await asyncio.sleep(self._retry_s)
                    continue
            await asyncio.sleep(max(0.1, self._granted / 3))
            reason = await self._refresh()
            if reason is None:
                continue
            if self._on_lost is not None:
                self._on_lost(reason)
            else:
                log.warning("lease lost", extra={"lease_of": self.what, "reason": reason,
                                                 "regrant": self.regrant})
            if not self.regrant:
                return
            self._lease_id = None  # the old one expires on its own; its keys are put anew

    async def _refresh(self) -> str | None:
        """One keepalive; None when the lease lives on, else why it is lost."""
        lease_id = self._lease_id
        assert lease_id is not None
        sent = time.monotonic()
        if sent >= self._valid_until:
            return "local deadline passed before a keepalive succeeded"
        try:
            ttl = await self._store.refresh_lease(
                lease_id, timeout=max(0.05, self._valid_until - sent), what=self.what)
        except StoreError as exc:
            if not self.regrant:
                self._lease_id = None
                await self._revoke(lease_id)
            return f"keepalive failed: {exc}"
        if ttl <= 0:
            self._lease_id = None
            return "lease expired or revoked in etcd"
        self._valid_until = sent + ttl - self._margin
        return None

    async def _revoke(self, lease_id: int) -> None:
        try:
            await self._store.revoke_lease(lease_id, timeout=max(1.0, self.ttl_s / 2),
                                           what=self.what)
        except Exception as exc:  # best effort: an unrevoked lease expires on its own
            log.info("lease revoke failed; it will expire on its own",
                     extra={"lease_of": self.what, "lease": f"{lease_id:x}",
                            "error": type(exc).__name__})


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
        self._keeper: LeaseKeeper | None = None
        self._create_revision: int | None = None
        self._held = False
        self.role = role  # the agenttx_leader{role} gauge, when set

    # ---- state -------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True only while the term is live and its local deadline has not passed."""
        return self._held and self._keeper is not None and self._keeper.valid

    @property
    def lease_id(self) -> int | None:
        return None if self._keeper is None else self._keeper.lease_id

    @property
    def _keepalive_task(self) -> asyncio.Task[Any] | None:
        """The term's keepalive (tests cancel it to simulate a paused process)."""
        return None if self._keeper is None else self._keeper.task

    @property
    def create_revision(self) -> int | None:
        """The revision at which our campaign created the key (the fencing token)."""
        return self._create_revision

    def fence(self) -> list[Compare]:
        """Compares to add to every etcd txn made on the strength of this lease.

        Raises NotLeader when the local term is over: the caller must stop acting.
        """
        lease_id = self.lease_id
        if not self.is_leader or lease_id is None or self._create_revision is None:
            raise NotLeader(f"not the holder of {self.key.decode(errors='replace')}")
        return [
            cmp_value(self.key, self.holder_id.encode()),
            cmp_create(self.key, self._create_revision),
            cmp_lease(self.key, lease_id),
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
            and kv.lease == self.lease_id
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
        keeper = LeaseKeeper(self._store, self.ttl_s, what=f"leader lease {self.key.decode()}",
                             attach=self._claim, regrant=False, margin_s=self._margin,
                             on_lost=self._lose)
        if not await keeper.acquire():
            return False
        self._keeper = keeper
        self._held = True
        self._gauge(1)
        keeper.start()
        log.info("leadership acquired",
                 extra={**self._log_fields(), "lease": f"{keeper.lease_id:x}",
                        "revision": self._create_revision, "ttl_s": self.ttl_s})
        return True

    async def _claim(self, lease_id: int) -> bool:
        """Put our holder id at the key on `lease_id` if nobody holds it (one CAS)."""
        res = await self._store.txn(
            [cmp_absent(self.key)],
            [op_put(self.key, self.holder_id.encode(), lease=lease_id)],
            what="leader campaign",
        )
        if res.succeeded:
            self._create_revision = res.revision
        return res.succeeded

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
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await keeper.stop()  # stops the keepalive, revokes the lease
