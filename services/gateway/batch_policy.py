"""What a version's dynamic batcher is told (``BatchPolicy``, from the model's config) and what it reports of each
batch it ran (``ExecutedBatch``, to the statistics)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExecutedBatch:
    """One batch the batcher ran, as its observer sees it (seconds)."""

    rows: int
    waits: list[float]
    """Queue wait of each request in the batch: from its arrival to the batch's run starting on a thread."""
    merge_s: float
    """Merging the requests' inputs into the batch."""
    execute_s: float
    """The runtime's run, from its start on a thread (the wait for a free thread is the requests' queue time)."""
    split_s: float
    """Checking the outputs and slicing them back to each caller."""


Observer = Callable[[ExecutedBatch], None]
"""Called once per executed batch, after its callers have their outputs."""


@dataclass(frozen=True)
class BatchPolicy:
    max_batch_size: int
    """0: the model has no batch dim, every request runs alone."""
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    instances: int = 1
    merge: bool = True
    """False when the config has no ``dynamic_batching``: requests still queue but run one by one."""
    max_queue_size: int = 0
    """Requests queued at most (0: unbounded); beyond it the lowest priority is refused with 503."""
    default_timeout_s: float = 0.0
    """0: requests wait in the queue as long as needed."""
    adaptive_delay: bool = True
    """Spend ``max_queue_delay_s`` only while recent batches were bigger than the one being formed (a lone
    closed-loop client never waits for company that cannot come; under load batches still fill), and only when a
    bigger batch is expected to cost less per row (the batcher's ``worth_waiting``); form an instance's next batch
    while its current one runs when the batcher's ``ahead`` allows it."""
