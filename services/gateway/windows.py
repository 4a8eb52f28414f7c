"""Sliding-window figures per model version (requests, 5xx answers, latency quantiles) for the canary's
automatic rollback and the admin view. One bucket per second; latencies in fixed log-spaced bins, so recording
is a few integer updates and p99 over the window a sum of at most ``window`` arrays."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

# Bin edges: 0.1 ms growing by 25 % up to ~100 s (63 edges); the quantile is read at a bin's upper edge.
EDGES = tuple(1e-4 * 1.25**i for i in range(63))
MAX_WINDOW_S = 3600


@dataclass(frozen=True)
class Figures:
    requests: int
    errors: int
    p99_s: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 6),
            "p99_ms": round(self.p99_s * 1e3, 3) if self.p99_s is not None else None,
        }


class Window:
    """The last ``keep_s`` seconds of one version's answers, by second."""

    def __init__(self, keep_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._keep_s = int(min(max(keep_s, 1.0), MAX_WINDOW_S)) + 1
        self._clock = clock
        self._seconds: dict[int, list[int]] = {}
        """second -> [requests, errors, *latency bins]"""

    def observe(self, status: int, seconds: float) -> None:
        now = int(self._clock())
        bucket = self._seconds.get(now)
        if bucket is None:
            bucket = self._seconds[now] = [0] * (2 + len(EDGES) + 1)
            self._forget(now)
        bucket[0] += 1
        if status >= 500:
            bucket[1] += 1
        bucket[2 + bisect.bisect_left(EDGES, seconds)] += 1

    def figures(self, window_s: float) -> Figures:
        since = self._clock() - window_s
        requests = errors = 0
        bins = [0] * (len(EDGES) + 1)
        for second, bucket in self._seconds.items():
            if second + 1 <= since:
                continue
            requests += bucket[0]
            errors += bucket[1]
            for index, count in enumerate(bucket[2:]):
                bins[index] += count
        return Figures(requests, errors, _quantile(bins, 0.99))

    def _forget(self, now: int) -> None:
        for second in [s for s in self._seconds if s < now - self._keep_s]:
            del self._seconds[second]


def _quantile(bins: list[int], q: float) -> float | None:
    total = sum(bins)
    if total == 0:
        return None
    rank = math.ceil(q * total)
    seen = 0
    for index, count in enumerate(bins):
        seen += count
        if seen >= rank:
            return EDGES[index] if index < len(EDGES) else math.inf
    return math.inf
