"""Per-model admission: at most ``limit`` requests of a model execute at once; the rest wait in a bounded queue,
highest priority first, and when it is full the lowest priority is turned away at once (never queued without bound).

Priorities are ranks: 1 is the highest, larger numbers are lower (as Triton's ``priority_levels``).

With ``node`` (``switchyard serve --workers N``) the limit holds for the node: a request executes when the node's
workers together execute fewer than ``limit`` (node_share.py keeps the count). The queue, its bound and the
shedding by priority stay per worker: each worker orders and sheds its own waiters.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass

from services.gateway.errors import DeadlineExceeded, Overloaded
from services.gateway.shaping.node_share import NodeSlots

NODE_POLL_S = 0.001
"""How often a worker with waiters looks whether another worker freed a slot of the node (it hears only of its own)."""


@dataclass(slots=True)
class _Waiter:
    rank: int
    future: asyncio.Future[None]


class ModelGate:
    """The gate of one model. ``enter`` and ``leave`` run on the event loop: plain counters and deques, no locks.

    ``node``: the model's slots across the node's workers. Then a request enters when the NODE executes fewer than
    ``limit`` (checked and taken under the node's file lock), ``inflight`` counts this worker's share of it, and
    while this worker has waiters it polls the node every ``NODE_POLL_S`` for slots freed by other workers. The
    queue bound and the priority shedding stay per worker. Without ``node`` nothing of this runs."""

    def __init__(
        self,
        model: str,
        limit: int,
        max_queue: int,
        adaptive: AdaptiveLimit | None = None,
        *,
        node: NodeSlots | None = None,
    ) -> None:
        self.model = model
        self._max_limit = limit
        self._max_queue = max_queue
        self._adaptive = adaptive
        self._node = node
        self._poller: asyncio.Task[None] | None = None
        """While this worker has waiters on a node gate: the task looking for slots other workers freed."""
        self.inflight = 0
        self._queues: dict[int, collections.deque[_Waiter]] = {}
        self.waiting = 0

    @property
    def limit(self) -> int:
        return self._adaptive.limit if self._adaptive is not None else self._max_limit

    async def enter(self, rank: int, deadline: float | None) -> None:
        """Return once the request may execute; raise ``Overloaded`` (queue full, or pushed out by a higher
        priority) or ``DeadlineExceeded`` (its deadline passed while it waited). ``deadline``: monotonic time."""
        node = self._node
        if node is None:
            if self.inflight < self.limit and not self.waiting:
                self.inflight += 1
                return
        elif not self.waiting and node.try_take(self.limit):
            self.inflight += 1
            return
        if self.waiting >= self._max_queue:
            self._make_room(rank)
        waiter = _Waiter(rank, asyncio.get_running_loop().create_future())
        self._queues.setdefault(rank, collections.deque()).append(waiter)
        self.waiting += 1
        if node is not None and self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll_node(node))
        try:
            if deadline is None:
                await waiter.future
            else:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    await waiter.future
        except BaseException as exc:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.leave(None)  # the slot was handed over just as the wait ended: give it back
            else:
                self._forget(waiter)
            if isinstance(exc, TimeoutError):
                raise DeadlineExceeded(
                    f"request to model '{self.model}' waited for a free slot until its deadline passed "
                    f"({self._executing()}, {self.waiting} waiting)"
                ) from None
            raise

    def leave(self, latency_s: float | None) -> None:
        """A request that entered has finished; ``latency_s``: how long it executed (feeds the adaptive limit)."""
        self.inflight -= 1
        if latency_s is not None and self._adaptive is not None:
            self._adaptive.observe(latency_s)
        if self._node is not None:
            self._node.give_back(self.limit, idle=not self.inflight and not self.waiting)
            self._admit_from_node(self._node)
            return
        while self.waiting and self.inflight < self.limit:
            waiter = self._pop_best()
            if waiter is None:
                return
            self.inflight += 1
            waiter.future.set_result(None)

    def _admit_from_node(self, node: NodeSlots) -> None:
        """Hands this worker's best waiters the node's free slots, one slot taken before each waiter is woken."""
        while self.waiting and node.try_take(self.limit):
            waiter = self._pop_best()
            if waiter is None:
                node.give_back(self.limit, idle=not self.inflight)
                return
            self.inflight += 1
            waiter.future.set_result(None)

    async def _poll_node(self, node: NodeSlots) -> None:
        """Runs while this worker has waiters: another worker's ``leave`` cannot wake them, so they look."""
        try:
            while self.waiting:
                await asyncio.sleep(NODE_POLL_S)
                self._admit_from_node(node)
        finally:
            self._poller = None

    def _make_room(self, rank: int) -> None:
        """The queue is full: shed its newest lowest-priority waiter if the newcomer outranks it, else the newcomer."""
        worst = max((r for r, q in self._queues.items() if q), default=None)
        if worst is None or worst <= rank:
            raise self._refusal(f"its queue is full ({self.waiting} waiting)")
        shed = self._queues[worst].pop()
        self.waiting -= 1
        shed.future.set_exception(self._refusal("a request of higher priority took its place in the queue"))

    def _refusal(self, why: str) -> Overloaded:
        return Overloaded(f"model '{self.model}' is at its concurrency limit ({self._executing()}) and {why}")

    def _executing(self) -> str:
        if self._node is None:
            return f"{self.inflight} executing"
        return f"{self._node.executing} executing on this node, {self.inflight} in this worker"

    def _pop_best(self) -> _Waiter | None:
        for rank in sorted(self._queues):
            queue = self._queues[rank]
            while queue:
                waiter = queue.popleft()
                self.waiting -= 1
                if not waiter.future.done():
                    return waiter
        return None

    def _forget(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.rank)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self.waiting -= 1


class AdaptiveLimit:
    """Finds the concurrency a backend sustains: grows by one per window of ``limit`` requests while their mean latency
    stays within ``tolerance`` × the unloaded latency, shrinks by 10 % when it does not. The unloaded latency is
    the smallest seen in the last ``baseline_s`` seconds, so it follows a model whose speed changes."""

    def __init__(self, ceiling: int, *, tolerance: float = 2.0, baseline_s: float = 30.0) -> None:
        self._ceiling = max(ceiling, 1)
        self._tolerance = tolerance
        self._baseline_s = baseline_s
        self._value = float(self._ceiling)
        self._best = float("inf")
        self._best_previous = float("inf")
        self._best_since = time.monotonic()
        self._seen = 0
        self._total_s = 0.0

    @property
    def limit(self) -> int:
        return max(1, int(self._value))

    def observe(self, latency_s: float) -> None:
        now = time.monotonic()
        if now - self._best_since > self._baseline_s:  # two half-windows: an old minimum ages out
            self._best_previous, self._best, self._best_since = self._best, float("inf"), now
        self._best = min(self._best, latency_s)
        baseline = min(self._best, self._best_previous)
        self._seen += 1
        self._total_s += latency_s
        if self._seen < self.limit:
            return
        mean = self._total_s / self._seen
        self._seen, self._total_s = 0, 0.0
        if mean > baseline * self._tolerance:
            self._value = max(1.0, self._value * 0.9)
        else:
            self._value = min(float(self._ceiling), self._value + 1.0)


def _loop_time(deadline: float) -> float:
    """``asyncio.timeout_at`` takes the loop's clock; deadlines are kept on ``time.monotonic``."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
