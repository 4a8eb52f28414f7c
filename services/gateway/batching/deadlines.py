"""The batcher's deadlines: one loop timer for every request in a version's batcher, armed for the earliest.

``asyncio.timeout`` around each request arms and cancels a timer per request, which costs more CPU than the rest
of a tiny model's batching. Here a request costs a heap push; the timer fires once per earliest deadline and fails
the requests whose time is up: a queued one at its queue deadline (the caller's or the queue policy's timeout), a
running one at the caller's deadline only, as in Triton (its batch still finishes; the result is not awaited)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time

from services.gateway.batching.queue import QueuedRequest
from services.gateway.errors import DeadlineExceeded

QUEUED = "the request's deadline passed while it waited in the batch queue"
RUNNING = "the request's deadline passed while its batch ran"


class BatchDeadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, QueuedRequest]] = []
        self._order = itertools.count()  # ties: first come, first failed (and items never compare)
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = math.inf

    def __len__(self) -> int:
        return len(self._heap)

    def watch(self, item: QueuedRequest) -> None:
        """Fail ``item.future`` with ``DeadlineExceeded`` once its deadline (``time.monotonic()``) passes."""
        if item.deadline is not None:
            self._push(item.deadline, item)

    def _push(self, deadline: float, item: QueuedRequest) -> None:
        heap = self._heap
        # Answered requests leave from the top: with one budget for all, deadlines come in arrival order, so the heap
        # holds about as many entries as requests in flight.
        while heap and heap[0][2].future.done():
            heapq.heappop(heap)
        heapq.heappush(heap, (deadline, next(self._order), item))
        if deadline < self._armed_for:
            self._arm(deadline)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_for = None, math.inf
        self._heap.clear()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(loop.time() + max(deadline - time.monotonic(), 0.0), self._expire)
        self._armed_for = deadline

    def _expire(self) -> None:
        self._timer, self._armed_for = None, math.inf
        heap = self._heap
        now = time.monotonic()
        later: list[QueuedRequest] = []
        while heap:
            deadline, _, item = heap[0]
            if deadline > now and not item.future.done():  # the loop's clock may run a little ahead: re-armed below
                break
            heapq.heappop(heap)
            if item.future.done():
                continue
            if not item.running:
                item.future.set_exception(DeadlineExceeded(QUEUED))
            elif item.expires is not None and item.expires <= now:
                item.future.set_exception(DeadlineExceeded(RUNNING))
            elif item.expires is not None:  # only the queue's timeout passed: the caller's deadline still holds
                later.append(item)
        for item in later:
            assert item.expires is not None
            heapq.heappush(heap, (item.expires, next(self._order), item))
        if heap:
            self._arm(heap[0][0])
