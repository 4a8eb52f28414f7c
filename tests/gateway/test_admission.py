"""Per-model admission gates and the batcher's ranked queue: priorities, shedding, deadlines, the adaptive limit."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from services.gateway.batching.batcher import BatchPolicy, DynamicBatcher
from services.gateway.errors import DeadlineExceeded, InvalidInput, Overloaded
from services.gateway.shaping.concurrency import AdaptiveLimit, ModelGate
from services.gateway.shaping.deadlines import Deadlines, Priorities
from services.gateway.tensors.types import Array
from tests.waiting import wait_until_async


async def _enter_in_order(gate: ModelGate, ranks: list[int], served: list[int]) -> list[asyncio.Task[None]]:
    async def one(rank: int, tag: int) -> None:
        await gate.enter(rank, None)
        served.append(tag)

    tasks = []
    for tag, rank in enumerate(ranks):
        tasks.append(asyncio.create_task(one(rank, tag)))
        await asyncio.sleep(0)  # queued in this order
    return tasks


async def test_gate_serves_highest_priority_first_when_slots_free_up() -> None:
    gate = ModelGate("m", limit=1, max_queue=10)
    await gate.enter(2, None)  # holds the only slot
    served: list[int] = []
    tasks = await _enter_in_order(gate, [3, 2, 1, 2], served)
    for _ in range(4):
        gate.leave(None)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert served == [2, 1, 3, 0]  # rank 1, then the two rank-2 requests in arrival order, then rank 3


async def test_gate_sheds_newest_lowest_priority_when_queue_full() -> None:
    gate = ModelGate("m", limit=1, max_queue=2)
    await gate.enter(2, None)
    served: list[int] = []
    low_old, low_new = await _enter_in_order(gate, [3, 3], served)
    high = asyncio.create_task(gate.enter(1, None))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="higher priority took its place") as shed:
        await low_new
    assert shed.value.retry_after_s == 1
    with pytest.raises(Overloaded, match=r"its queue is full \(2 waiting\)"):
        await gate.enter(3, None)  # as low as everything queued: refused at once, nothing else shed
    gate.leave(None)
    await high
    gate.leave(None)
    await low_old
    assert (gate.inflight, gate.waiting) == (1, 0)


async def test_gate_refuses_at_once_when_queue_is_zero() -> None:
    gate = ModelGate("m", limit=1, max_queue=0)
    await gate.enter(2, None)
    with pytest.raises(Overloaded):  # not a TimeoutError: a request that queued would wait for ever (no deadline)
        await asyncio.wait_for(gate.enter(1, None), timeout=5.0)


async def test_gate_answers_deadline_and_frees_its_place_when_wait_outlasts_deadline() -> None:
    gate = ModelGate("m", limit=1, max_queue=4)
    await gate.enter(2, None)
    with pytest.raises(DeadlineExceeded, match="waited for a free slot until its deadline passed"):
        await gate.enter(2, time.monotonic() + 0.02)
    assert gate.waiting == 0
    gate.leave(None)
    await gate.enter(2, None)  # the slot went back to the gate, not to the request that gave up
    assert gate.inflight == 1


async def test_gate_returns_slot_when_waiter_is_cancelled_after_handover() -> None:
    gate = ModelGate("m", limit=1, max_queue=4)
    await gate.enter(2, None)
    waiter = asyncio.create_task(gate.enter(2, None))
    await asyncio.sleep(0)
    gate.leave(None)  # hands the slot to the waiter ...
    waiter.cancel()  # ... whose client gives up before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (gate.inflight, gate.waiting) == (0, 0)


def test_adaptive_limit_shrinks_when_latency_grows_and_recovers_when_it_falls() -> None:
    limit = AdaptiveLimit(16)
    for _ in range(64):
        limit.observe(0.001)
    assert limit.limit == 16
    for _ in range(200):
        limit.observe(0.010)  # ten times the unloaded latency: overloaded
    assert limit.limit <= 4
    for _ in range(400):
        limit.observe(0.001)
    assert limit.limit == 16


def test_deadlines_take_the_shortest_named_and_cut_to_the_maximum() -> None:
    deadlines = Deadlines(default_s=60.0, max_s=10.0)
    assert deadlines.budget(None, None, None) == 10.0  # the default, cut to the maximum
    assert deadlines.budget(0.5, "250", None) == 0.25
    assert deadlines.budget(None, "2.5", 0.001) == 0.001
    assert Deadlines(None, None).budget(None, None, None) is None


@pytest.mark.parametrize("header", ["abc", "-5", "0", "1e3", "١٠", "9" * 40, "", "0.0000001"])
def test_deadlines_refuse_header_when_not_positive_milliseconds(header: str) -> None:
    with pytest.raises(InvalidInput, match="X-Request-Timeout must be a positive number of milliseconds") as refused:
        Deadlines(None, None).budget(None, header, None)
    assert "at most 12 digits, and 6 after the point" in str(refused.value)  # why 0.0000001 is refused


def test_priorities_rank_parameter_over_header_and_refuse_out_of_range() -> None:
    priorities = Priorities(levels=3, default=2)
    assert priorities.rank(0, None) == 2
    assert priorities.rank(0, "1") == 1
    assert priorities.rank(3, "1") == 3
    with pytest.raises(InvalidInput, match=r"priority 4 is out of range: use 1 \(highest\) to 3"):
        priorities.rank(4, None)
    with pytest.raises(InvalidInput, match="X-Priority must be an integer from 1"):
        priorities.rank(0, "high")


async def test_batcher_serves_higher_priority_first_and_sheds_lowest_when_queue_full() -> None:
    order: list[float] = []
    release = asyncio.Event()

    async def execute(inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
        order.append(float(inputs["x"][0, 0]))
        await release.wait()
        return {"y": inputs["x"]}, 0.0

    batcher = DynamicBatcher(execute, BatchPolicy(max_batch_size=1, max_queue_size=2))
    await batcher.start()

    def submit(tag: float, priority: int) -> asyncio.Task[dict[str, Array]]:
        return asyncio.create_task(batcher.submit({"x": np.full((1, 1), tag, np.float32)}, priority=priority))

    running = submit(0, 2)
    assert await wait_until_async(lambda: order == [0])  # executing: the queue is empty again
    low, normal = submit(1, 3), submit(2, 2)
    await asyncio.sleep(0)
    high = submit(3, 1)  # the queue is full: the low-priority request makes room
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="higher priority took this one's place"):
        await low
    release.set()
    await asyncio.gather(running, normal, high)
    assert order == [0, 3, 2]
    await batcher.close()
