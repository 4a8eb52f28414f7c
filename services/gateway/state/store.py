"""``StateStore``: where routing records and the audit log live. A file by default; the interface is small so
that a shared store (Redis, for several gateway replicas) can take its place."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from services.gateway.state.records import Event, RoutingRecord

OnChange = Callable[[str, RoutingRecord], Awaitable[None]]
"""Told of a routing record another gateway wrote (model, record)."""


class StateBusy(Exception):
    """Another gateway holds the model's action lock; the message says who and what it is doing."""


class StateStore(Protocol):
    shared: bool
    """Other gateways read and write the same records (Redis): what one gateway's repository lacks, another's may
    hold, so a start repairs only its own view of a record, never the record the others serve by."""

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
        """Add one event to the audit log, durably; ``StateError`` when it cannot. A shared store that cannot take it
        now keeps it in memory instead (bounded) and writes it, once and in order, when it can."""

    async def events(self, model: str | None = None, limit: int = 100) -> list[Event]:
        """The newest ``limit`` events (of ``model``, when given), oldest first; with a shared store, those this
        gateway keeps because the store could not take them yet are among them, marked ``pending``."""

    def lock(self, model: str, holder: str) -> AbstractAsyncContextManager[None]:
        """Held while a version action runs on ``model``, across every gateway sharing the store: ``StateBusy``
        when another holds it (``holder`` describes this one for their messages), ``StateError`` when the store
        cannot be reached."""

    async def watch(self, on_change: OnChange) -> None:
        """Call ``on_change`` for every routing record other gateways write (within a second), until cancelled;
        returns at once for a store no other gateway shares. A record may be told again (a shared store tells every
        record at each poll): ``on_change`` skips what it has taken already and retries what it could not take."""
