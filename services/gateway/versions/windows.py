"""Sliding-window figures per model version (requests, 5xx answers, latency quantiles) for the canary's
automatic rollback and the admin view. One bucket per second; latencies in fixed log-spaced bins, so recording
is a few integer updates and p99 over the window a sum of at most ``window`` arrays."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.gateway.state import RoutingRecord

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


class TrafficWindows:
    """Windows of the models that have a canary split on; ``observe`` is called by the dataplane for their
    unversioned requests only (``watched`` is the cheap check on the hot path)."""

    def __init__(self) -> None:
        self.watched: set[str] = set()
        self._windows: dict[tuple[str, int], Window] = {}
        self._keep_s: dict[str, float] = {}
        self._split: dict[str, tuple[object, ...]] = {}

    def watch(self, model: str, record: RoutingRecord | None) -> None:
        """Start the windows of ``model`` afresh when its split changes (the stable or canary version, the canary's
        start): other routing changes (a shadow set) keep the figures gathered so far."""
        canary = record.canary if record is not None else None
        split = (record.stable, canary.version, canary.since, canary.weight) if record and canary else ()
        if self._split.get(model) != split:
            self._split[model] = split
            for key in [k for k in self._windows if k[0] == model]:
                del self._windows[key]
        if canary is None or canary.weight <= 0:
            self.watched.discard(model)
            return
        self._keep_s[model] = canary.rollback.window_s if canary.rollback is not None else 60.0
        self.watched.add(model)

    def observe(self, model: str, version: int, status: int, seconds: float) -> None:
        window = self._windows.get((model, version))
        if window is None:
            window = self._windows[model, version] = Window(self._keep_s.get(model, 60.0))
        window.observe(status, seconds)

    def figures(self, model: str, version: int, window_s: float) -> Figures:
        window = self._windows.get((model, version))
        return window.figures(window_s) if window is not None else Figures(0, 0, None)
