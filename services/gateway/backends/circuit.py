"""A small circuit breaker: stop sending work to a backend that keeps failing, try again on a timer."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Closed: calls pass and consecutive failures are counted; ``failure_threshold`` of them open it.

    Open: ``allow()`` says no until ``reset_timeout_s`` has passed, then the breaker half-opens and lets
    one trial call through; its success closes the breaker, its failure opens it for another period.
    ``trip()`` opens it at once (a health probe that found the backend down), ``reset()`` closes it (one
    that found it up). Not thread-safe: use it from one event loop.
    """

    def __init__(
        self, failure_threshold: int, reset_timeout_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if reset_timeout_s <= 0:
            raise ValueError("reset_timeout_s must be positive")
        self.failure_threshold = failure_threshold
        self.reset_timeout_s = reset_timeout_s
        self._clock = clock
        self._state = CircuitState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_in_flight = False

    @property
    def state(self) -> CircuitState:
        if self._state is CircuitState.OPEN and self._clock() - self._opened_at >= self.reset_timeout_s:
            return CircuitState.HALF_OPEN
        return self._state

    def allow(self) -> bool:
        """Whether a call may go out now; in half-open state only one trial call at a time does."""
        state = self.state
        if state is CircuitState.CLOSED:
            return True
        if state is CircuitState.OPEN or self._trial_in_flight:
            return False
        self._state = CircuitState.HALF_OPEN
        self._trial_in_flight = True
        return True

    def record_success(self) -> None:
        self.reset()

    def record_failure(self) -> None:
        self._trial_in_flight = False
        if self._state is CircuitState.HALF_OPEN:
            self.trip()
            return
        self._failures += 1
        if self._state is CircuitState.CLOSED and self._failures >= self.failure_threshold:
            self.trip()

    def release(self) -> None:
        """A call that was allowed ended without telling anything about the backend (a client error)."""
        self._trial_in_flight = False

    def trip(self) -> None:
        self._state = CircuitState.OPEN
        self._opened_at = self._clock()
        self._trial_in_flight = False

    def reset(self) -> None:
        self._state = CircuitState.CLOSED
        self._failures = 0
        self._trial_in_flight = False

    def retry_after_s(self) -> int:
        """Whole seconds until the next trial (at least 1): what a ``Retry-After`` header should say."""
        if self._state is CircuitState.CLOSED:
            return 1
        remaining = self.reset_timeout_s - (self._clock() - self._opened_at)
        return max(1, math.ceil(remaining))
