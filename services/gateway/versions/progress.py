"""Version actions as they run (step by step, for the live view and the metrics) and as they ended (the report
an admin call answers with)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from services.gateway.metrics import GatewayMetrics
from services.gateway.state import RoutingRecord
from services.gateway.state.records import now_iso

GATEWAY = "gateway"
"""The actor of what the gateway does by itself (startup, repository polling)."""


@dataclass
class Progress:
    action: str
    version: int | None
    step: str = "starting"
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds per finished step, in the order they ran."""
    started_at: str = field(default_factory=now_iso)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The node's other workers (``serve --workers N``): worker index -> seconds per step (or its ``error``)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Steps:
    """Times each step of one action into its ``Progress`` and ``switchyard_swap_step_seconds``; a step that
    raises stays the current one, so the failure names it."""

    def __init__(self, model: str, metrics: GatewayMetrics, progress: Progress) -> None:
        self.model = model
        self.metrics = metrics
        self.progress = progress
        self._started = time.perf_counter()

    @asynccontextmanager
    async def run(self, name: str) -> AsyncIterator[None]:
        self.progress.step = name
        started = time.perf_counter()
        yield
        elapsed = time.perf_counter() - started
        self.progress.steps[name] = round(elapsed, 6)
        self.metrics.swap_step.labels(self.model, name).observe(elapsed)

    def worker(self, index: int, seconds: dict[str, Any]) -> None:
        """Another worker of the node ran steps of this action (``versions/node.py``)."""
        self.progress.workers.setdefault(str(index), {}).update(seconds)

    def mark(self, name: str) -> None:
        """Seconds from the action's start to now, as ``name`` (``to_flip``, ``to_drained``)."""
        self.progress.steps[name] = round(time.perf_counter() - self._started, 6)

    def mark_flip(self) -> str:
        """``to_flip``, and the wall-clock time of the flip (microseconds: clients compare it with their own)."""
        self.mark("to_flip")
        return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class ActionReport:
    model: str
    action: str
    result: str
    """``ok``, ``unchanged`` or ``failed``."""
    versions: dict[str, int | None]
    steps: dict[str, float]
    routing: RoutingRecord | None = None
    comparison: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None
    """The replay check's report (``verify_replay``): on success, and on the failure it caused."""
    drained: bool | None = None
    """Whether the replaced version's requests all finished within the drain timeout."""
    in_flight_left: int | None = None
    unloaded: tuple[int, ...] = ()
    flipped_at: str | None = None
    step: str | None = None
    error: str | None = None
    note: str | None = None
    """What the caller should know of an action that had nothing to do (an unload of a model not in the repository)."""
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The node's other workers' steps (``serve --workers N``), by worker index; empty with one worker."""
    finished_at: str = field(default_factory=now_iso)

    def but(self, **changes: Any) -> ActionReport:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["routing"] = self.routing.to_json() if self.routing is not None else None
        if self.routing is not None and self.routing.shadow is not None:
            # The record keeps the fraction it persists; the admin API speaks percent, as the canary's weight does.
            data["routing"]["shadow"]["percent"] = self.routing.shadow.percent
        data["unloaded"] = list(self.unloaded)
        return data
