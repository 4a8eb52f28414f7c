"""Dynamic batcher for one model version: merges queued requests into batches, runs up to ``instances`` batches at
once, and splits the outputs back to each caller's future (``queue``). What it is told (``BatchPolicy``, from the
model's config) and what it reports of each batch it ran (``ExecutedBatch``, to the statistics) are defined here.

When ``ahead`` allows it, each instance may also hold a next batch, formed while its current one runs and handed to
the runtime's threads at once: the thread that finishes a batch then starts that one without waiting for the event
loop's turn (which, under load, comes after every answer and request the loop has ready)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.gateway.batching.deadlines import QUEUED, BatchDeadlines
from services.gateway.batching.queue import QueuedRequest, RankedQueue, Tensors, answer, check_rows, merge_inputs
from services.gateway.errors import DeadlineExceeded, GatewayError, InferenceFailed, Overloaded
from services.gateway.tensors.types import Array


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


Execute = Callable[[dict[str, Array]], Awaitable[tuple[dict[str, Array], float]]]
"""Runs a merged batch: its outputs, and the seconds it waited for a free thread before its run began (0 when it
ran at once); the statistics count that wait as the requests' queue time, not the model's."""


class DynamicBatcher:
    def __init__(
        self,
        execute: Execute,
        policy: BatchPolicy,
        observer: Observer | None = None,
        *,
        beside: Callable[[int], bool] | None = None,
        worth_waiting: Callable[[int, int], bool] | None = None,
        ahead: Callable[[int, int], bool] | None = None,
    ) -> None:
        """``beside(rows)``: whether a batch of that many rows runs at the same time as the others' (on a worker
        thread); ``None``: always, as ``execute`` then never holds the loop. ``worth_waiting(rows, full)``: whether
        growing a batch of ``rows`` towards ``full`` is expected to make it cheaper per row (with the policy's
        ``adaptive_delay``; ``None``: always). ``ahead(rows, full)``: whether an instance's next batch may form while
        its current one runs, asked after every batch with the recent batches' size (with ``adaptive_delay``;
        ``None``: never)."""
        self._execute = execute
        self._policy = policy
        self._observer = observer
        self._beside = beside
        self._worth_waiting = worth_waiting if policy.adaptive_delay else None
        self._ahead = ahead if policy.adaptive_delay else None
        self._instances = max(policy.instances, 1)
        self._share = -(-policy.max_batch_size // self._instances)
        """Rows a forming batch stops at while another instance is idle (all of them with one instance)."""
        self._queue = RankedQueue()
        self._deadlines = BatchDeadlines()
        self._workers: list[asyncio.Task[None]] = []
        self._busy = 0
        self._draining = 0
        """Callers waiting in ``drain``."""
        # Created in start() so that they belong to the running loop.
        self._wakeup: asyncio.Event | None = None
        self._forming: asyncio.Lock | None = None
        self._idle: asyncio.Condition | None = None
        self._ahead_open: asyncio.Event | None = None
        """Set while ``ahead`` allows the workers that form next batches to form them."""
        preferred = [p for p in policy.preferred_batch_sizes if 0 < p <= policy.max_batch_size]
        self._target = max(preferred, default=max(policy.max_batch_size, 1)) if policy.merge else 1
        self._preferred = frozenset(preferred)
        self._recent_rows = float(self._target)  # moving average of executed batch sizes
        self._flush_due = False
        """Set by the batch being formed's timer: its delay is over."""
        self._wanted = 0
        """Queued requests that would wake the worker forming a batch (0: any, as an idle worker wants)."""
        self._timed = False
        """Set once a traced request came: from then on each batch looks for requests that want its timing."""

    async def start(self) -> None:
        self._wakeup, self._forming, self._idle = asyncio.Event(), asyncio.Lock(), asyncio.Condition()
        self._workers = [asyncio.create_task(self._work()) for _ in range(self._instances)]
        if self._ahead is not None:  # one more per instance, forming its next batch while allowed
            self._ahead_open = asyncio.Event()
            self._workers += [asyncio.create_task(self._work(self._ahead_open)) for _ in range(self._instances)]

    async def submit(
        self, inputs: Tensors, *, timeout_s: float | None = None, priority: int = 0, timing: list[float] | None = None
    ) -> dict[str, Array]:
        """Queue one request (batch dim first when the model batches) and wait for its own outputs. ``priority``:
        lower values leave the queue first; a full queue refuses the lowest one (which may be a queued request).
        ``timing`` (a traced request's): filled with its batch's run, ``time.monotonic()`` at its start on a thread
        and at its end, and the batch's rows (its queue wait is from the submit to that start)."""
        if self._wakeup is None:
            raise GatewayError("batcher used before start()")
        policy = self._policy
        queue = self._queue
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            self._make_room(priority)
        now = time.monotonic()
        queue_timeout = policy.default_timeout_s
        limit = min(timeout_s, queue_timeout) if timeout_s and queue_timeout else timeout_s or queue_timeout
        shapes = [array.shape for array in inputs.values()]
        first = shapes[0]
        item = QueuedRequest(  # in field order (positional: a keyword call costs more on every request)
            inputs,
            first[0] if policy.max_batch_size > 0 and first else 1,
            asyncio.get_running_loop().create_future(),
            now,
            now + limit if limit else None,
            (first[1:],) if len(shapes) == 1 else tuple([shape[1:] for shape in shapes]),
            priority,
            now + timeout_s if timeout_s else None,
        )
        if timing is not None:
            item.timing = timing
            self._timed = True
        queue.append(item)
        self._deadlines.watch(item)
        if len(queue) >= self._wanted:  # a worker waits for a first request, or this one fills its batch
            self._wakeup.set()
        return await item.future

    def _make_room(self, priority: int) -> None:
        worst = self._queue.worst_rank()
        limit = self._policy.max_queue_size
        if worst is None or worst <= priority:
            raise Overloaded(f"the batch queue is full ({limit} requests waiting)")
        shed = self._queue.pop_worst()
        if not shed.future.done():
            shed.future.set_exception(
                Overloaded(
                    f"the batch queue is full ({limit} requests waiting): a request of higher priority took "
                    "this one's place"
                )
            )

    async def drain(self) -> None:
        """Wait until nothing is queued or executing."""
        assert self._idle is not None
        self._draining += 1
        try:
            async with self._idle:
                await self._idle.wait_for(lambda: not self._queue and self._busy == 0)
        finally:
            self._draining -= 1

    async def close(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        # Dropped: a cancelled task's error holds its frame, which holds this batcher, which holds the runtime
        # session: a cycle that kept an unloaded version's memory until the collector's next full pass.
        self._workers = []
        self._deadlines.close()
        while self._queue:
            item = self._queue.popleft()
            if not item.future.done():
                item.future.set_exception(GatewayError("model version was unloaded", 503))

    async def _work(self, allowed: asyncio.Event | None = None) -> None:
        """Form a batch, run it, repeat; a worker given ``allowed`` forms one only while it is set."""
        assert self._forming is not None
        while True:
            if allowed is not None:
                await allowed.wait()
            async with self._forming:
                batch = await self._collect()  # counted busy from its first request on: drain waits for it
            try:
                await self._run(batch)
            finally:
                # Hold no tensor while waiting for the next batch: one may be a view of a client's shared memory,
                # which must unmap when the client unregisters it, not when the next request comes.
                batch = []
                self._busy -= 1
                if self._wanted:  # a batch forming meanwhile may hold this instance's share by now
                    assert self._wakeup is not None
                    self._wakeup.set()
                if self._draining:  # nobody else waits for the batcher to go idle: no lock to take per batch
                    await self._notify_idle()

    async def _notify_idle(self) -> None:
        assert self._idle is not None
        async with self._idle:
            self._idle.notify_all()

    def _take(self) -> QueuedRequest | None:
        """Pop the next live item, failing the ones whose deadline passed while queued."""
        now = time.monotonic()
        while self._queue:
            item = self._queue.popleft()
            if item.future.done():  # the caller gave up (disconnect, deadline)
                continue
            if item.deadline is not None and now > item.deadline:
                item.future.set_exception(DeadlineExceeded(QUEUED))
                continue
            return item
        return None

    async def _collect(self) -> list[QueuedRequest]:
        """Wait for a first request, then gather more until the batch is full or its delay has passed. From the
        first request on the worker counts as busy, and a close() that cancels it answers what it holds."""
        assert self._wakeup is not None
        item = self._take()
        while item is None:
            self._wakeup.clear()
            await self._wakeup.wait()
            item = self._take()
        self._busy += 1
        batch = [item]
        try:
            await self._gather(batch)
        except asyncio.CancelledError:
            for held in batch:
                if not held.future.done():
                    held.future.set_exception(GatewayError("model version was unloaded", 503))
            self._busy -= 1
            raise
        return batch

    async def _gather(self, batch: list[QueuedRequest]) -> None:
        assert self._wakeup is not None
        item = batch[0]
        rows = item.rows
        delay = self._policy.max_queue_delay_s
        if self._policy.adaptive_delay and self._recent_rows < rows + 0.5:
            delay = 0.0
        flush_at = item.enqueued + delay
        # One timer per batch, not one per arrival: it ends the wait, the arrivals in between only wake the loop.
        timer: asyncio.TimerHandle | None = None
        self._flush_due = False
        instances = self._instances
        try:
            while rows < self._target:
                if rows >= self._share and self._busy < instances and (self._beside is None or self._beside(rows)):
                    # Another instance waits with nothing to run: the rest of the queue is its batch. Growing this
                    # one alone would send every client into one batch at a time, and in a closed loop they would
                    # stay that way, one instance working while the others wait.
                    break
                if self._queue:
                    nxt = self._take()
                    if nxt is None:
                        continue
                    if nxt.key != item.key or rows + nxt.rows > self._policy.max_batch_size:
                        self._queue.appendleft(nxt)  # it opens the next batch
                        break
                    batch.append(nxt)
                    rows += nxt.rows
                    continue
                if rows in self._preferred or self._flush_due:
                    break
                if self._policy.adaptive_delay and self._recent_rows < rows + 0.5:
                    # The queue is drained and the batch is as big as recent ones: in a closed loop its company is
                    # already in it (16 clients, 16 rows), and waiting would only idle for the rest of the delay.
                    break
                if timer is None:
                    remaining = flush_at - time.monotonic()
                    if remaining <= 0:
                        break
                    if self._worth_waiting is not None and not self._worth_waiting(rows, self._target):
                        break  # company would not make the batch cheaper per row: run what is here
                    timer = asyncio.get_running_loop().call_later(remaining, self._flush)
                # Woken when the queue could fill the batch or the delay is over, not by every arrival: each wake-up
                # is a task switch, and while a batch forms under load most arrivals would only add one row.
                self._wanted = self._target - rows
                if self._policy.adaptive_delay:  # woken too once the batch is as big as recent ones
                    self._wanted = max(min(self._wanted, round(self._recent_rows) - rows), 1)
                self._wakeup.clear()
                await self._wakeup.wait()
                self._wanted = 0
        finally:
            self._wanted = 0
            if timer is not None:
                timer.cancel()

    def _flush(self) -> None:
        self._flush_due = True
        assert self._wakeup is not None
        self._wakeup.set()

    async def _run(self, batch: list[QueuedRequest]) -> None:
        started = time.monotonic()
        rows = 0
        for item in batch:
            item.running = True
            rows += item.rows
        self._recent_rows = 0.8 * self._recent_rows + 0.2 * rows
        try:
            merged = merge_inputs(batch)
            merged_at = time.monotonic()
            outputs, waited = await self._execute(merged)
            executed_at = time.monotonic()
            if self._policy.max_batch_size > 0:
                check_rows(outputs, rows)
        except (Exception, asyncio.CancelledError) as exc:  # every caller in the batch gets the cause
            error = exc if isinstance(exc, GatewayError) else InferenceFailed(f"inference failed: {exc}")
            if isinstance(exc, asyncio.CancelledError):
                error = GatewayError("model version was unloaded", 503)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        answer(batch, outputs)
        if self._timed:
            for item in batch:
                if item.timing is not None:
                    item.timing += (started + waited, executed_at, float(rows))
        if self._observer is not None:  # the callers resume on a later loop turn: they see the batch counted
            waits = [started + waited - item.enqueued for item in batch]
            split_s = time.monotonic() - executed_at
            self._observer(ExecutedBatch(rows, waits, merged_at - started, executed_at - merged_at - waited, split_s))
        if self._ahead is not None:
            assert self._ahead_open is not None  # made by start() whenever there is an ``ahead``
            if self._ahead(max(round(self._recent_rows), 1), self._target):
                self._ahead_open.set()
            else:
                self._ahead_open.clear()
