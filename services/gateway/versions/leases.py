"""Version leases: every admitted request holds one on the version that serves it until its answer is ready,
so a swap can wait for the old version's requests to finish before unloading it."""

from __future__ import annotations

import asyncio
import time

from services.gateway.metrics import GatewayMetrics


class Leases:
    """Counts per (model, version). ``acquire``/``release`` are plain dict updates (the hot path); ``drain``
    waits on an event that only exists while someone drains."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._counts: dict[tuple[str, int], int] = {}
        self._drained: dict[tuple[str, int], asyncio.Event] = {}

    def acquire(self, model: str, version: int) -> None:
        key = (model, version)
        count = self._counts.get(key)
        if count is None:
            # First request of this version: its in-flight gauge reads the count when scraped.
            self._metrics.inflight.labels(model, str(version)).set_function(lambda: self._counts.get(key, 0))
            count = 0
        self._counts[key] = count + 1

    def release(self, model: str, version: int) -> None:
        key = (model, version)
        left = self._counts[key] - 1
        self._counts[key] = left
        if left == 0 and self._drained:
            event = self._drained.pop(key, None)
            if event is not None:
                event.set()

    def count(self, model: str, version: int) -> int:
        return self._counts.get((model, version), 0)

    async def drain(self, model: str, version: int, timeout_s: float) -> bool:
        """Wait until no request holds a lease on the version; False when ``timeout_s`` passed first."""
        key = (model, version)
        deadline = time.monotonic() + timeout_s
        while self._counts.get(key, 0) > 0:
            event = self._drained.setdefault(key, asyncio.Event())  # set and dropped by the last release
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                return self._counts.get(key, 0) == 0
        return True
