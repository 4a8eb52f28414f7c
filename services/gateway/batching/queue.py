"""The dynamic batcher's queue (one FIFO per priority rank, the lowest rank served first) and a batch's tensors:
its requests' inputs merged along the batch dim for one run, the run's outputs checked to hold a row per merged row,
and sliced back to each caller (views, no copies)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from services.gateway.errors import InferenceFailed
from services.gateway.tensors.types import Array

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
    timing: list[float] | None = None
    """A traced request's slot for its batch's run (``DynamicBatcher.submit``): start, end, rows."""


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


def merge_inputs(batch: list[QueuedRequest]) -> dict[str, Array]:
    if len(batch) == 1:
        return dict(batch[0].inputs)
    return {name: np.concatenate([item.inputs[name] for item in batch]) for name in batch[0].inputs}


def check_rows(outputs: dict[str, Array], rows: int) -> None:
    """Refuse a run whose outputs do not have one row per merged row: slicing them back would misanswer callers."""
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != rows:
            found = value.shape[0] if value.ndim else 0
            raise InferenceFailed(f"output '{name}' has {found} rows for a batch of {rows}")


def answer(batch: list[QueuedRequest], outputs: dict[str, Array]) -> None:
    """Each caller still waiting gets its own rows of every output."""
    if len(batch) == 1:
        if not batch[0].future.done():
            batch[0].future.set_result(outputs)
        return
    offset = 0
    for item in batch:
        if not item.future.done():
            item.future.set_result({name: value[offset : offset + item.rows] for name, value in outputs.items()})
        offset += item.rows
