"""`--max-requests-per-s`: a token bucket per principal on this replica (docs/security.md#quotas).

Why per principal: one client must not starve the others, and a shared limit would
let it. Why per replica: a deployment-wide rate would cost an etcd round trip per
request; the open-transaction quota is the deployment-wide one.

Bounded memory: a bucket that has refilled completely is the same as no bucket, so
buckets idle that long are dropped (oldest first, amortised O(1) per check), and at
most `max_principals` are kept whatever happens. Pure: the clock is injected.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ResourceExhausted
from .principal import Principal

DEFAULT_MAX_PRINCIPALS = 100_000


@dataclass
class _Bucket:
    tokens: float
    updated: float


def _fmt(value: float) -> str:
    return f"{value:g}"


class RateLimiter:
    """`check(principal)` spends one token or raises errors.ResourceExhausted.

    rate_per_s: sustained requests per second per principal; 0 = unlimited.
    burst: bucket size (default: one second's worth, at least 1).
    """

    def __init__(self, rate_per_s: float, *, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 max_principals: int = DEFAULT_MAX_PRINCIPALS) -> None:
        if rate_per_s < 0:
            raise ValueError("rate_per_s must be >= 0")
        self.rate = float(rate_per_s)
        self.burst = float(burst) if burst is not None else max(1.0, self.rate)
        if self.burst < 1:
            raise ValueError("burst must be >= 1")
        self.max_principals = max_principals
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self.message = f"max-requests-per-s ({_fmt(self.rate)}) exceeded for this principal"

    @property
    def unlimited(self) -> bool:
        return self.rate == 0

    def __len__(self) -> int:
        return len(self._buckets)

    def _sweep(self, now: float) -> None:
        full_after = self.burst / self.rate
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if now - oldest.updated < full_after:
                break
            self._buckets.popitem(last=False)

    def check(self, principal: Principal) -> None:
        if self.rate == 0:
            return
        now = self._clock()
        self._sweep(now)
        bucket = self._buckets.get(principal.name)
        if bucket is None:
            bucket = _Bucket(tokens=self.burst, updated=now)
            self._buckets[principal.name] = bucket
            if len(self._buckets) > self.max_principals:
                self._buckets.popitem(last=False)
        else:
            elapsed = max(0.0, now - bucket.updated)
            bucket.tokens = min(self.burst, bucket.tokens + elapsed * self.rate)
            bucket.updated = now
            self._buckets.move_to_end(principal.name)
        if bucket.tokens < 1.0:
            raise ResourceExhausted(self.message)
        bucket.tokens -= 1.0
