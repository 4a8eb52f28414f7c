"""Audit events the Redis store could not write yet (Redis unreachable, or refusing writes): kept in this gateway's
memory in the order they were recorded, bounded (past the bound the oldest is dropped, logged and counted), until
the store writes them. Each carries an id that makes its write idempotent (``redis_store``), so an event whose
write Redis took but whose answer was lost is not written twice when it is tried again."""

from __future__ import annotations

import json
import logging
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.gateway.state.records import Event

log = logging.getLogger(__name__)

EVENTS_PENDING = 1_000
"""The most events kept waiting: version actions are rare (a few an hour), so this covers a long outage; past it
the oldest go, since the newest say how things stand."""


@dataclass(slots=True, eq=False)
class Pending:
    event: Event
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Names the event's one write: the store writes an id once, however often it is tried."""
    refused: bool = False
    """A write of it has failed (it was kept, not written straight away)."""


class BacklogMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.pending = Gauge(
            "switchyard_audit_events_pending",
            "Audit events recorded while the shared state store (Redis) could not take them, kept in this gateway's "
            "memory until it does.",
            registry=registry,
        )
        self.dropped = Counter(
            "switchyard_audit_events_dropped_total",
            "Audit events lost: the oldest waiting ones, dropped when more than the gateway keeps were waiting.",
            registry=registry,
        )


class EventBacklog:
    """The events waiting, oldest first. ``registry``: where its figures are counted (``None``: nowhere shown)."""

    def __init__(self, bound: int = EVENTS_PENDING, registry: CollectorRegistry | None = None) -> None:
        if bound < 1:
            raise ValueError(f"the audit events kept waiting must be at least 1, got {bound}")
        self.bound = bound
        self._waiting: deque[Pending] = deque()
        self.metrics = BacklogMetrics(registry if registry is not None else CollectorRegistry())

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, pending: object) -> bool:
        return any(waiting is pending for waiting in self._waiting)

    def __iter__(self) -> Iterator[Pending]:
        return iter(list(self._waiting))  # a copy: the store awaits between items, and events arrive meanwhile

    def keep(self, waiting: Pending) -> None:
        self._waiting.append(waiting)
        while len(self._waiting) > self.bound:
            dropped = self._waiting.popleft()
            self.metrics.dropped.inc()
            log.error("audit event dropped, never written to the state store: more than %d were waiting for it: %s",
                      self.bound, json.dumps(dropped.event.to_json()))
        self.metrics.pending.set(len(self._waiting))

    def oldest(self) -> Pending | None:
        return self._waiting[0] if self._waiting else None

    def written(self, waiting: Pending) -> None:
        """``waiting`` is in the store now (it may have been dropped meanwhile: then there is nothing to take out)."""
        if self._waiting and self._waiting[0] is waiting:
            self._waiting.popleft()
        self.metrics.pending.set(len(self._waiting))

    def refused(self) -> None:
        """A write failed: every event waiting now has waited for the store."""
        for waiting in self._waiting:
            waiting.refused = True
