"""``StateStore``: where routing records and the audit log live. A file by default; the interface is small so
that a shared store (Redis, for several gateway replicas) can take its place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from services.gateway.state.records import Event, RoutingRecord


class StateStore(Protocol):
    async def open(self) -> None:
        """Acquire what the store needs (files, locks, connections); raise ``StateError`` naming the cause."""

    async def close(self) -> None:
        """Release it; safe to call twice."""

    async def load_routing(self) -> Mapping[str, RoutingRecord]:
        """Every persisted routing record, keyed by model name."""

    async def save_routing(self, model: str, record: RoutingRecord) -> None:
        """Persist ``record`` for ``model``; durable when it returns (a crash right after keeps it), and all or
        nothing (a crash during the call leaves the previous records intact)."""

    async def append_event(self, event: Event) -> None:
        """Add one event to the audit log, durably."""

    async def events(self, model: str | None = None, limit: int = 100) -> list[Event]:
        """The newest ``limit`` events (of ``model``, when given), oldest first."""
