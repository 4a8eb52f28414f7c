"""The batcher's one-timer deadlines: a queued request fails at its queue deadline, a running one at the caller's
deadline only, the heap stays as small as the requests in flight, and a lone request's batch delay ends under
uvloop's millisecond clock (a timer that fired early once left a lone request waiting for company for ever)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import uvloop

from services.gateway.batching.batcher import BatchPolicy, DynamicBatcher
from services.gateway.batching.deadlines import QUEUED, RUNNING
from services.gateway.errors import DeadlineExceeded
from services.gateway.tensors.types import Array
from tests.waiting import wait_until_async


class Slow:
    """Doubles its input after ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.runs = 0

    async def __call__(self, inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
        self.runs += 1
        await asyncio.sleep(self.delay_s)
        return {"y": inputs["x"] * 2}, 0.0


def one_row(value: float) -> dict[str, Array]:
    return {"x": np.full((1, 2), value, dtype=np.float32)}


@pytest.mark.slow  # wall-clock figures
async def test_batcher_fails_running_request_at_its_deadline_when_the_batch_outlasts_it() -> None:
    batcher = DynamicBatcher(Slow(0.3), BatchPolicy(max_batch_size=4))
    await batcher.start()
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=RUNNING):
        await batcher.submit(one_row(1.0), timeout_s=0.05)
    assert time.monotonic() - started < 0.25  # answered at its deadline, not when the batch ended
    await batcher.close()


@pytest.mark.slow  # wall-clock figures
async def test_batcher_fails_queued_request_at_its_deadline_when_workers_are_busy() -> None:
    slow = Slow(0.3)
    batcher = DynamicBatcher(slow, BatchPolicy(max_batch_size=1))
    await batcher.start()
    first = asyncio.create_task(batcher.submit(one_row(1.0)))
    assert await wait_until_async(lambda: slow.runs == 1)  # the only worker is busy
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=QUEUED):
        await batcher.submit(one_row(2.0), timeout_s=0.05)
    assert time.monotonic() - started < 0.25
    np.testing.assert_array_equal((await first)["y"], one_row(2.0)["x"])
    await batcher.close()


async def test_batcher_keeps_deadline_heap_near_inflight_count_when_many_requests_pass() -> None:
    batcher = DynamicBatcher(Slow(0.0), BatchPolicy(max_batch_size=8))
    await batcher.start()
    for _ in range(50):
        await asyncio.gather(*(batcher.submit(one_row(i), timeout_s=60.0) for i in range(8)))
    assert len(batcher._deadlines) <= 16, len(batcher._deadlines)  # noqa: SLF001 - the bound is the point
    await batcher.close()


@pytest.mark.slow  # wall-clock figures
def test_lone_request_is_answered_after_the_batch_delay_when_run_on_uvloop() -> None:
    async def lone_requests() -> list[float]:
        # Adaptive delay off: every lone request waits out its 0.3-1.5 ms delay, which uvloop's timers round to ms.
        batcher = DynamicBatcher(Slow(0.0), BatchPolicy(max_batch_size=8, max_queue_delay_s=0.0003,
                                                          adaptive_delay=False))  # fmt: skip
        await batcher.start()
        waits = []
        for i in range(200):
            began = time.monotonic()
            await asyncio.wait_for(batcher.submit(one_row(i)), timeout=2.0)
            waits.append(time.monotonic() - began)
        await batcher.close()
        return waits

    waits = uvloop.run(lone_requests())
    assert max(waits) < 0.5, f"slowest lone request took {max(waits) * 1e3:.1f} ms"
