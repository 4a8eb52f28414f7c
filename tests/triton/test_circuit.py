"""The circuit breaker on a fake clock: opens after consecutive failures, half-opens for one trial."""

from __future__ import annotations

import pytest

from services.gateway.backends.circuit import CircuitBreaker, CircuitState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state(breaker: CircuitBreaker) -> CircuitState:
    """Read through a call: mypy would otherwise keep the state narrowed across the breaker's methods."""
    return breaker.state


def test_breaker_opens_when_failures_reach_threshold_and_fails_fast_while_open() -> None:
    clock = Clock()
    breaker = CircuitBreaker(3, 2.0, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    assert state(breaker) is CircuitState.CLOSED
    breaker.record_failure()
    assert state(breaker) is CircuitState.OPEN
    assert not breaker.allow()
    clock.now += 0.5
    assert breaker.retry_after_s() == 2  # 1.5 s left, rounded up


def test_breaker_lets_one_trial_through_when_reset_timeout_passed() -> None:
    clock = Clock()
    breaker = CircuitBreaker(1, 1.0, clock=clock)
    breaker.record_failure()
    clock.now += 1.0
    assert state(breaker) is CircuitState.HALF_OPEN
    assert breaker.allow()
    assert not breaker.allow()  # one trial at a time
    breaker.record_success()
    assert state(breaker) is CircuitState.CLOSED
    assert breaker.allow()


def test_breaker_opens_again_when_trial_fails() -> None:
    clock = Clock()
    breaker = CircuitBreaker(1, 1.0, clock=clock)
    breaker.trip()
    clock.now += 1.5
    assert breaker.allow()
    breaker.record_failure()
    assert state(breaker) is CircuitState.OPEN
    assert not breaker.allow()


def test_breaker_counts_only_consecutive_failures_when_successes_interleave() -> None:
    breaker = CircuitBreaker(2, 1.0, clock=Clock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert state(breaker) is CircuitState.CLOSED


def test_breaker_refuses_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        CircuitBreaker(0, 1.0)
    with pytest.raises(ValueError, match="reset_timeout_s"):
        CircuitBreaker(1, 0.0)
