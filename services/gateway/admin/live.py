"""Live figures for the ops console: the gateway's own request counters and latency histograms (its Prometheus
metrics) are read every second while a console is watching, every few seconds otherwise, and kept for the last
minutes, so that requests/s, 5xx rate and p50/p99 of every model version (and the shadow's divergence) can be drawn as
series without a Prometheus server. Nothing is added to the request path: the series are differences of counters the
dataplane keeps anyway, and reading them costs the event loop about a millisecond."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from services.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

PERIOD_S = 1.0
"""How often the counters are read while a console is watching."""
IDLE_PERIOD_S = 5.0
"""How often they are read when no console asked for figures in the last ``WATCHED_S``: the history an on-call
engineer finds on opening the page, at a fifth of the cost."""
WATCHED_S = 120.0
KEEP_S = 600.0
"""How far back the series go (the console asks for up to ``KEEP_S / 60`` minutes)."""
REQUESTS = "switchyard_requests_total"
DURATION = "switchyard_request_duration_seconds"
SHADOW_REQUESTS = "switchyard_shadow_requests_total"
DIVERGENCE = "switchyard_shadow_divergence"
DISAGREEMENTS = "switchyard_shadow_argmax_disagreements_total"


@dataclass(frozen=True)
class Counts:
    """Cumulative counts of one series: requests, 5xx answers (or shadow requests not compared), and histogram buckets
    (cumulative, as Prometheus keeps them, in ``edges`` order)."""

    requests: float = 0.0
    errors: float = 0.0
    buckets: tuple[float, ...] = ()
    other: float = 0.0
    """Shadow only: argmax disagreements."""


@dataclass(frozen=True)
class Snapshot:
    at: float
    """Monotonic seconds: differences between snapshots."""
    wall: float
    """Epoch seconds: what the console plots against."""
    versions: dict[tuple[str, int], Counts]
    shadows: dict[str, Counts]


class LiveFigures:
    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        period_s: float = PERIOD_S,
        idle_period_s: float = IDLE_PERIOD_S,
        watched_s: float = WATCHED_S,
        keep_s: float = KEEP_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.period_s = period_s
        self.idle_period_s = idle_period_s
        self.watched_s = watched_s
        self.keep_s = keep_s
        # Only the series the console draws: collecting the whole registry costs several times more.
        self._collectors = (metrics.requests, metrics.request_duration, metrics.shadow_requests,
                            metrics.shadow_divergence, metrics.shadow_argmax_disagreements)
        self._clock = clock
        self._wall = wall
        self._snapshots: deque[Snapshot] = deque(maxlen=int(keep_s / period_s) + 2)
        self._edges: dict[str, tuple[float, ...]] = {}
        self._asked = -math.inf
        self.reads = 0
        """How many times the counters were read (tests, and a curious operator)."""
        self._task: asyncio.Task[None] | None = None
        self.source: Callable[[], Awaitable[Iterable[Any]]] | None = None
        """Where the counters are read instead of this process's registry (``serve --workers N``: the node's
        families, every worker's merged), as metric families."""

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="console-live-figures")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            now = self._clock()
            last = self._snapshots[-1].at if self._snapshots else -math.inf
            if now - self._asked >= self.watched_s and now - last < self.idle_period_s - self.period_s / 2:
                continue  # nobody watching: a read every idle period is history enough
            try:
                self.sample(await self.source() if self.source is not None else None)
            except Exception:  # the console's figures must never take the gateway down
                log.exception("reading the live figures failed")

    def sample(self, families: Iterable[Any] | None = None) -> None:
        """Read the counters once: every ``period_s`` while a console watches, every ``idle_period_s`` otherwise;
        from ``families`` when given (the node's), else from this process's collectors."""
        versions: dict[tuple[str, int], dict[str, Any]] = {}
        shadows: dict[str, dict[str, Any]] = {}
        if families is None:
            families = (family for collector in self._collectors for family in collector.collect())
        for family in families:
            for sample in family.samples:
                labels = sample.labels
                model = labels.get("model", "")
                if sample.name == REQUESTS:
                    key = _version_key(model, labels.get("version", ""))
                    if key is not None:
                        into = versions.setdefault(key, {})
                        into["requests"] = into.get("requests", 0.0) + sample.value
                        if labels.get("code", "").startswith("5"):
                            into["errors"] = into.get("errors", 0.0) + sample.value
                elif sample.name == DURATION + "_bucket":
                    key = _version_key(model, labels.get("version", ""))
                    if key is not None:
                        versions.setdefault(key, {}).setdefault("buckets", []).append((_le(labels), sample.value))
                elif sample.name == SHADOW_REQUESTS:
                    into = shadows.setdefault(model, {})
                    field = "requests" if labels.get("result") == "ok" else "errors"
                    into[field] = into.get(field, 0.0) + sample.value
                elif sample.name == DIVERGENCE + "_bucket":
                    shadows.setdefault(model, {}).setdefault("buckets", []).append((_le(labels), sample.value))
                elif sample.name == DISAGREEMENTS:
                    shadows.setdefault(model, {})["other"] = sample.value
        snapshot = Snapshot(
            self._clock(),
            self._wall(),
            {key: self._counts(DURATION, fields) for key, fields in versions.items()},
            {model: self._counts(DIVERGENCE, fields) for model, fields in shadows.items()},
        )
        self._snapshots.append(snapshot)
        self.reads += 1
        while self._snapshots[0].at < snapshot.at - self.keep_s - self.period_s:
            self._snapshots.popleft()

    def _counts(self, histogram: str, fields: dict[str, Any]) -> Counts:
        buckets = sorted(fields.get("buckets", []))
        if buckets:
            self._edges[histogram] = tuple(le for le, _ in buckets)
        return Counts(fields.get("requests", 0.0), fields.get("errors", 0.0), tuple(v for _, v in buckets),
                      fields.get("other", 0.0))

    def series(self, model: str, *, minutes: float, step_s: float) -> dict[str, Any]:
        """Per version of ``model``, one point per ``step_s`` over the last ``minutes``: requests/s, 5xx rate and
        latency quantiles of the requests answered in that step; and the shadow's runs and divergence."""
        self._asked = self._clock()
        picked = self._picked(minutes * 60.0, step_s)
        pairs = list(zip(picked, picked[1:], strict=False))
        keys = sorted({key for snap in picked for key in snap.versions if key[0] == model})
        latency, divergence = self._edge(DURATION), self._edge(DIVERGENCE)
        versions = [
            {"version": key[1], "points": [_point(a, b, a.versions.get(key), b.versions.get(key), latency)
                                           for a, b in pairs]}
            for key in keys
        ]
        shadow = [_shadow_point(a, b, a.shadows.get(model), b.shadows.get(model), divergence) for a, b in pairs]
        return {"versions": versions, "shadow": shadow}

    def _edge(self, histogram: str) -> tuple[float, ...]:
        return self._edges.get(histogram, ())

    def _picked(self, span_s: float, step_s: float) -> list[Snapshot]:
        """Snapshots ``step_s`` apart, newest last, reaching back ``span_s``."""
        picked: list[Snapshot] = []
        for snap in reversed(self._snapshots):
            if picked and picked[-1].at - snap.at < step_s - self.period_s / 2:
                continue
            if picked and picked[0].at - snap.at > span_s + self.period_s / 2:
                break
            picked.append(snap)
        picked.reverse()
        return picked


def _version_key(model: str, version: str) -> tuple[str, int] | None:
    """Only real versions: ``_other`` (unknown names) and unrouted rejections have no series of their own."""
    return (model, int(version)) if version.isascii() and version.isdigit() else None


def _le(labels: dict[str, str]) -> float:
    return float(labels.get("le", "+Inf"))


def _delta(new: Counts | None, old: Counts | None) -> Counts:
    """``new - old`` (a series that appeared in between started from zero; counters never go back)."""
    if new is None:
        return Counts()
    if old is None:
        return new
    buckets = new.buckets  # a histogram that appeared in between: every observation is new
    if len(old.buckets) == len(new.buckets):
        buckets = tuple(max(n - o, 0.0) for n, o in zip(new.buckets, old.buckets, strict=True))
    return Counts(
        max(new.requests - old.requests, 0.0),
        max(new.errors - old.errors, 0.0),
        buckets,
        max(new.other - old.other, 0.0),
    )


def _point(
    a: Snapshot, b: Snapshot, old: Counts | None, new: Counts | None, edges: tuple[float, ...]
) -> dict[str, Any]:
    step = _delta(new, old)
    seconds = max(b.at - a.at, 1e-9)
    answered = step.buckets[-1] if step.buckets else 0.0
    p50, p99 = quantile(step.buckets, edges, 0.5), quantile(step.buckets, edges, 0.99)
    return {
        "t": round(b.wall, 3),
        "requests": int(step.requests),
        "rps": round(step.requests / seconds, 3),
        "errors": int(step.errors),
        "error_rate": round(step.errors / step.requests, 6) if step.requests else None,
        "p50_ms": round(p50 * 1e3, 3) if p50 is not None and answered else None,
        "p99_ms": round(p99 * 1e3, 3) if p99 is not None and answered else None,
    }


def _shadow_point(
    a: Snapshot, b: Snapshot, old: Counts | None, new: Counts | None, edges: tuple[float, ...]
) -> dict[str, Any]:
    step = _delta(new, old)
    seconds = max(b.at - a.at, 1e-9)
    return {
        "t": round(b.wall, 3),
        "compared": int(step.requests),
        "rps": round(step.requests / seconds, 3),
        "not_compared": int(step.errors),
        "argmax_disagreements": int(step.other),
        "divergence_p50_le": _upper_edge(step.buckets, edges, 0.5),
        "divergence_max_le": _upper_edge(step.buckets, edges, 1.0),
    }


def quantile(buckets: Iterable[float], edges: tuple[float, ...], q: float) -> float | None:
    """``histogram_quantile`` of cumulative ``buckets``: linear within the bucket the rank falls in; the highest
    finite edge when it falls in ``+Inf``; ``None`` without observations."""
    counts = list(buckets)
    if not counts or not counts[-1] or len(counts) != len(edges):
        return None
    rank = q * counts[-1]
    below, lower = 0.0, 0.0
    for count, edge in zip(counts, edges, strict=True):
        if count >= rank and count > below:
            if math.isinf(edge):
                return lower
            return lower + (edge - lower) * (rank - below) / (count - below)
        below, lower = count, edge if not math.isinf(edge) else lower
    return lower


def _upper_edge(buckets: tuple[float, ...], edges: tuple[float, ...], q: float) -> float | None:
    """The upper edge of the bucket holding the ``q`` quantile (``None`` for +Inf or no observations): the
    divergence histogram's buckets are decades, so "at most" is all an honest reading says."""
    if not buckets or not buckets[-1] or len(buckets) != len(edges):
        return None
    rank = q * buckets[-1]
    for count, edge in zip(buckets, edges, strict=True):
        if count >= rank and count > 0:
            return None if math.isinf(edge) else edge
    return None
