"""`--max-requests-per-s`: the per-principal token bucket (docs/security.md#quotas). Injected
clock, no sleeps."""

from __future__ import annotations

import pytest

from agenttx import errors
from agenttx.auth import ANONYMOUS, Principal, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


ALICE, BOB = Principal("alice", "team-a"), Principal("bob", "team-b")


def exhausted(limiter: RateLimiter, principal: Principal) -> str:
    with pytest.raises(errors.ResourceExhausted) as err:
        limiter.check(principal)
    return str(err.value)


def test_zero_means_unlimited() -> None:
    limiter = RateLimiter(0)
    for _ in range(10_000):
        limiter.check(ALICE)
    assert limiter.unlimited and len(limiter) == 0


def test_burst_then_refill_at_the_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(5, clock=clock)
    for _ in range(5):
        limiter.check(ALICE)
    assert exhausted(limiter, ALICE) == "max-requests-per-s (5) exceeded for this principal"
    clock.now += 0.2  # one token back
    limiter.check(ALICE)
    assert exhausted(limiter, ALICE) == "max-requests-per-s (5) exceeded for this principal"
    clock.now += 10  # refills to the burst, not beyond
    for _ in range(5):
        limiter.check(ALICE)
    exhausted(limiter, ALICE)


def test_one_principal_cannot_starve_another() -> None:
    clock = Clock()
    limiter = RateLimiter(2, clock=clock)
    limiter.check(ALICE)
    limiter.check(ALICE)
    exhausted(limiter, ALICE)
    limiter.check(BOB)
    limiter.check(BOB)
    exhausted(limiter, BOB)
    limiter.check(ANONYMOUS)


def test_fractional_rate_and_explicit_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(0.5, burst=3, clock=clock)
    for _ in range(3):
        limiter.check(ALICE)
    assert exhausted(limiter, ALICE) == "max-requests-per-s (0.5) exceeded for this principal"
    clock.now += 1.9
    exhausted(limiter, ALICE)
    clock.now += 0.1
    limiter.check(ALICE)


def test_idle_principals_are_dropped() -> None:
    clock = Clock()
    limiter = RateLimiter(10, clock=clock)
    for i in range(1000):
        limiter.check(Principal(f"agent-{i}"))
    assert len(limiter) == 1000
    clock.now += 1.0  # every bucket has refilled: indistinguishable from no bucket
    limiter.check(ALICE)
    assert len(limiter) == 1


def test_memory_is_capped_even_for_active_principals() -> None:
    clock = Clock()
    limiter = RateLimiter(1, clock=clock, max_principals=100)
    for i in range(250):
        limiter.check(Principal(f"agent-{i}"))
    assert len(limiter) == 100


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        RateLimiter(-1)
    with pytest.raises(ValueError):
        RateLimiter(1, burst=0.5)
