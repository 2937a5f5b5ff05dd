"""Serve a call on the cached state of a transaction, and ask etcd before trusting a doubt.

Why one helper: a replica answers most calls from its cache of the transaction (one
round trip instead of two), but another replica may have moved the transaction on since.
Whatever the cache says can only be wrong in one direction, and the three calls that
change a transaction (ExecuteStep, CommitTransaction, RollbackTransaction) handle it the
same way, here:

- a *refusal* judged on a cached state (not found, wrong step, not active, out of range)
  may be stale: the cache entry is dropped and the call judged again on a fresh read
  before anything is answered;
- a compare-and-swap that lost (`Stale`) changed nothing: the caller's `on_stale`
  decides from what the failure branch returned whether to run again (on the cache or
  on a fresh read) or to answer; a CAS is never re-sent blindly.

What it must never do: retry a refusal judged on a fresh read (that one is the answer),
or loop forever (`attempts` bounds it, then `gave_up` is raised).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import FailedPrecondition, InvalidArgument, NotFound
from .cache import TxCache, TxState
from .undo import Stale

T = TypeVar("T")

# Refusals a stale cache can cause; each is re-judged on a fresh read.
DOUBTFUL = (FailedPrecondition, NotFound, InvalidArgument)


async def on_current_state(
    txs: TxCache,
    tx_id: str,
    *,
    load: Callable[[], Awaitable[TxState]],
    judge: Callable[[TxState], Awaitable[TxState]],
    act: Callable[[TxState], Awaitable[T]],
    on_stale: Callable[[Stale, bool], bool],
    gave_up: Callable[[], Exception],
    attempts: int,
    use_cache: bool = True,
    usable: Callable[[TxState], bool] = lambda state: True,
) -> T:
    """Run `act` on the transaction's current state.

    `load()` reads the state from etcd; a cached state is used instead when there is one
    and `usable(cached)`. `judge(state)` checks the call against the state (and may
    settle it); it returns the state to act on or raises a refusal. `act(state)` does the
    work; when its CAS lost it raises `Stale`, and `on_stale(stale, from_cache)` says
    whether the next attempt may use the cache (True) or must read etcd (False), or
    raises the answer itself.
    """
    for _ in range(attempts):
        cached = txs.get(tx_id) if use_cache else None
        if cached is not None and not usable(cached):
            cached = None
        state = cached if cached is not None else await load()
        try:
            state = await judge(state)
        except DOUBTFUL:
            if cached is None:
                raise
            # judged on a cached state: maybe stale, ask etcd before answering
            txs.evict(tx_id)
            use_cache = False
            continue
        try:
            return await act(state)
        except Stale as stale:
            use_cache = on_stale(stale, cached is not None)
    raise gave_up()


__all__ = ["DOUBTFUL", "on_current_state"]
