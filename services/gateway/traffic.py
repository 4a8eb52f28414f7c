"""The canary's watch: per-version windows of the model's unversioned traffic while a split is on, the bounds
that pull a misbehaving canary back, and the promotion of one that behaved for ``promote_after_s``."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.gateway.errors import Conflict, GatewayError
from services.gateway.policy import pull_back_canary
from services.gateway.progress import GATEWAY
from services.gateway.state import RoutingRecord
from services.gateway.state.policies import CanaryPolicy
from services.gateway.windows import Figures, Window

if TYPE_CHECKING:
    from services.gateway.manager import VersionManager

log = logging.getLogger(__name__)
CHECK_PERIOD_S = 0.5


@dataclass(frozen=True)
class Breach:
    reason: str
    """``error_rate`` or ``p99_ratio``: the label of ``switchyard_canary_rollbacks_total``."""
    detail: str


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


def breach(canary: CanaryPolicy, stable: Figures, trial: Figures) -> Breach | None:
    """The first bound the canary breaks, judged once it has ``min_requests`` (and, for the latency ratio, the
    stable side too)."""
    bounds = canary.rollback
    if bounds is None or trial.requests < bounds.min_requests:
        return None
    if bounds.max_error_rate is not None and trial.error_rate > bounds.max_error_rate:
        return Breach(
            "error_rate",
            f"canary 5xx rate {trial.error_rate:.1%} over {trial.requests} requests is above "
            f"{bounds.max_error_rate:.1%} (stable: {stable.error_rate:.1%} over {stable.requests})",
        )
    limit, baseline, latency = bounds.max_p99_ratio, stable.p99_s, trial.p99_s
    if limit is not None and stable.requests >= bounds.min_requests and baseline and latency is not None:
        ratio = latency / baseline
        if ratio > limit:
            return Breach(
                "p99_ratio",
                f"canary p99 {latency * 1e3:.1f} ms is {ratio:.2f}x the stable's {baseline * 1e3:.1f} ms "
                f"(bound {limit:g}x)",
            )
    return None


async def watch_canaries(manager: VersionManager) -> None:
    """Every ``CHECK_PERIOD_S``: pull back a canary that breaks a bound, promote one that behaved long enough."""
    while True:
        await asyncio.sleep(CHECK_PERIOD_S)
        for model, record in list(manager.router.records.items()):
            canary = record.canary
            if canary is None or canary.weight <= 0:
                continue
            try:
                await _check(manager, model, record, canary)
            except Conflict:
                pass  # another action on the model runs now; the next period looks again
            except GatewayError as exc:
                log.error("canary of model '%s': %s", model, exc)
            except Exception:  # the watch must outlive any surprise
                log.exception("canary watch of model '%s' failed", model)


async def _check(manager: VersionManager, model: str, record: RoutingRecord, canary: CanaryPolicy) -> None:
    windows = manager.windows
    window_s = canary.rollback.window_s if canary.rollback is not None else 60.0
    stable = windows.figures(model, record.stable, window_s)
    trial = windows.figures(model, canary.version, window_s)
    broken = breach(canary, stable, trial)
    if broken is not None:
        await pull_back_canary(manager, model, broken, stable, trial)
        return
    if canary.promote_after_s is not None and _age_s(canary.since) >= canary.promote_after_s:
        log.info("model '%s': canary version %d behaved for %gs: promoting it", model, canary.version,
                 canary.promote_after_s)
        await manager.activate(model, canary.version, actor=GATEWAY)


def _age_s(since: str) -> float:
    if not since:
        return 0.0
    started = dt.datetime.fromisoformat(since).timestamp()
    return time.time() - started
