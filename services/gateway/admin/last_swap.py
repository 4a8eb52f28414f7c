"""The newest activate or rollback of each model in the audit log, as the console's bulk read shows it on each card.

Reading the audit log is the costly part of that read (the file store reads its whole file), so a model's answer is
kept and read again only when a newer event of the model may have been written since: its routing changed, this
gateway finished another action on it, or the change it routes by has no event in the log yet (a swap writes its
event after the drain, well after the flip that changes the routing)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.gateway.state.records import Event
from services.gateway.versions.manager import VersionManager

SWAPS = frozenset({"activate", "rollback"})
WINDOW = 200
"""How many of a model's newest events are looked through (the console read as many per model before)."""
SETTLE_MARGIN_S = 60.0
"""Beyond the longest drain an action may ask for: how long after a routing change its event may still come. Past it,
a change that wrote no event (a crash between flip and event) stops being waited for."""


@dataclass(frozen=True)
class _Known:
    key: tuple[int | None, str | None]
    """The model's routing generation and the end of this gateway's last action on it, when read."""
    settled: bool
    """The event of the change the routing was at is in what was read: nothing newer can come for this key."""
    event: dict[str, Any] | None


class LastSwaps:
    def __init__(self, manager: VersionManager) -> None:
        self._manager = manager
        self._known: dict[str, _Known] = {}

    async def of(self, models: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """Each model's newest activate or rollback event (``None``: none among its last ``WINDOW`` events)."""
        found = {model: await self._one(model) for model in models}
        for gone in set(self._known) - set(found):  # a model that left the repository
            del self._known[gone]
        return found

    async def _one(self, model: str) -> dict[str, Any] | None:
        record = self._manager.router.record(model)
        last = self._manager.last.get(model)
        key = (record.generation if record is not None else None, last.finished_at if last is not None else None)
        known = self._known.get(model)
        if known is not None and known.key == key and known.settled:
            return known.event
        events = await self._manager.audit_events(model, WINDOW)
        swaps = [event for event in events if event.action in SWAPS]
        newest = max(swaps, key=lambda event: event.time).to_json() if swaps else None
        settled = record is None or _recorded(events, record.generation) or _long_ago(
            record.updated_at, self._manager.settings.max_drain_timeout_s + SETTLE_MARGIN_S
        )
        self._known[model] = _Known(key, settled, newest)
        return newest


def _recorded(events: list[Event], generation: int) -> bool:
    return any(event.generation is not None and event.generation >= generation for event in events)


def _long_ago(iso: str | None, seconds: float) -> bool:
    if not iso:
        return True
    try:
        then = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return True
    return time.time() - then > seconds
