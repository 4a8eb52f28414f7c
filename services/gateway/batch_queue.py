"""The dynamic batcher's queue: one FIFO per priority rank, the lowest rank served first."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from dataclasses import dataclass

from services.gateway.types import Array

Tensors = Mapping[str, Array]


@dataclass(slots=True)
class QueuedRequest:
    inputs: Tensors
    rows: int
    future: asyncio.Future[dict[str, Array]]
    enqueued: float
    deadline: float | None
    """When it must have left the queue: the caller's deadline or the queue policy's timeout, the sooner."""
    key: tuple[tuple[int, ...], ...]
    rank: int = 0
    """Priority: lower ranks leave the queue first."""
    expires: float | None = None
    """The caller's own deadline, which still holds once its batch runs (the queue policy's timeout does not)."""
    running: bool = False
    """Set once its batch started."""


class RankedQueue:
    """FIFO per priority rank, lowest rank served first. Nearly every request has the default rank, so the common
    case is one deque."""

    def __init__(self) -> None:
        self._queues: dict[int, collections.deque[QueuedRequest]] = {}
        self._ranks: list[int] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, item: QueuedRequest) -> None:
        queue = self._queues.get(item.rank)
        if queue is None:
            queue = self._queues[item.rank] = collections.deque()
            self._ranks = sorted(self._queues)
        queue.append(item)
        self._size += 1

    def appendleft(self, item: QueuedRequest) -> None:
        """Put back the item just taken: it opens the next batch."""
        self._queues[item.rank].appendleft(item)
        self._size += 1

    def popleft(self) -> QueuedRequest:
        for rank in self._ranks:
            queue = self._queues[rank]
            if queue:
                self._size -= 1
                return queue.popleft()
        raise IndexError("pop from an empty queue")

    def worst_rank(self) -> int | None:
        return next((rank for rank in reversed(self._ranks) if self._queues[rank]), None)

    def pop_worst(self) -> QueuedRequest:
        """The newest request of the lowest priority: the one that has waited least among those that matter least."""
        rank = self.worst_rank()
        assert rank is not None
        self._size -= 1
        return self._queues[rank].pop()
