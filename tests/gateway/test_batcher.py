"""DynamicBatcher: merging, splitting, instance parallelism, queue policy and failure fan-out."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.gateway.batching.batcher import BatchPolicy, DynamicBatcher, ExecutedBatch
from services.gateway.errors import DeadlineExceeded, GatewayError, InferenceFailed, Overloaded
from services.gateway.tensors.types import Array
from tests.waiting import wait_until_async


class Recorder:
    """An execute() that doubles its input, records batch sizes, and can be held or made to fail."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.delay_s = delay_s
        self.fail = fail
        self.running = 0
        self.max_running = 0

    async def __call__(self, inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
        self.batches.append(int(inputs["x"].shape[0]))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.delay_s)
            if self.fail:
                raise RuntimeError("kernel exploded")
            return {"y": inputs["x"] * 2, "n": np.arange(inputs["x"].shape[0])}, 0.0
        finally:
            self.running -= 1


def rows(n: int, start: float) -> dict[str, Array]:
    return {"x": np.arange(start, start + 2 * n, dtype=np.float32).reshape(n, 2)}


async def started(execute: Recorder, **policy: object) -> DynamicBatcher:
    batcher = DynamicBatcher(execute, BatchPolicy(**policy))  # type: ignore[arg-type]
    await batcher.start()
    return batcher


async def test_batcher_merges_and_splits_rows_when_requests_arrive_together() -> None:
    execute = Recorder(delay_s=0.01)
    batcher = await started(execute, max_batch_size=8, max_queue_delay_s=0.05)
    requests = [rows(1 + i % 3, 10.0 * i) for i in range(6)]
    outputs = await asyncio.gather(*(batcher.submit(r) for r in requests))
    await batcher.close()
    assert sum(execute.batches) == sum(1 + i % 3 for i in range(6))
    assert len(execute.batches) < len(requests)
    assert max(execute.batches) <= 8
    for request, output in zip(requests, outputs, strict=True):
        np.testing.assert_array_equal(output["y"], request["x"] * 2)


async def test_batcher_dispatches_at_preferred_size_when_reached() -> None:
    execute = Recorder()
    batcher = await started(execute, max_batch_size=16, preferred_batch_sizes=(4,), max_queue_delay_s=5.0)
    outputs = await asyncio.wait_for(asyncio.gather(*(batcher.submit(rows(1, i)) for i in range(4))), 2.0)
    await batcher.close()
    assert execute.batches == [4]
    assert [int(o["n"][0]) for o in outputs] == [0, 1, 2, 3]


@pytest.mark.slow  # wall-clock figures
async def test_batcher_flushes_partial_batch_when_queue_delay_expires() -> None:
    execute = Recorder()
    batcher = await started(execute, max_batch_size=32, max_queue_delay_s=0.02)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await batcher.submit(rows(1, 0))
    await batcher.close()
    assert execute.batches == [1]
    assert 0.015 <= loop.time() - began < 1.0


async def test_batcher_runs_batches_in_parallel_when_instances_above_one() -> None:
    execute = Recorder(delay_s=0.05)
    batcher = await started(execute, max_batch_size=1, instances=3)
    await asyncio.gather(*(batcher.submit(rows(1, i)) for i in range(6)))
    await batcher.close()
    assert execute.max_running == 3


async def test_batcher_splits_a_burst_between_instances_when_another_one_is_idle() -> None:
    execute = Recorder(delay_s=0.2)
    batcher = await started(execute, max_batch_size=32, instances=2, max_queue_delay_s=0.01)
    outputs = await asyncio.wait_for(asyncio.gather(*(batcher.submit(rows(1, i)) for i in range(32))), 2.0)
    await batcher.close()
    # Half the burst each, side by side; one batch of 32 would leave the other instance idle throughout.
    assert execute.batches == [16, 16]
    assert execute.max_running == 2
    assert [int(o["n"][0]) for o in outputs] == [*range(16), *range(16)]


@pytest.mark.slow  # wall-clock figures
async def test_batcher_runs_a_held_share_when_the_busy_instance_becomes_idle() -> None:
    execute = Recorder(delay_s=0.05)
    batcher = await started(execute, max_batch_size=32, instances=2, max_queue_delay_s=5.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await asyncio.wait_for(asyncio.gather(*(batcher.submit(rows(1, i)) for i in range(32))), 2.0)
    await batcher.close()
    assert execute.batches == [16, 16]
    assert loop.time() - began < 1.0  # the second half ran once the first instance was free, not after the delay


async def test_batcher_fills_one_batch_when_its_runs_would_not_go_beside_another() -> None:
    execute = Recorder(delay_s=0.01)
    batcher = DynamicBatcher(
        execute, BatchPolicy(max_batch_size=32, instances=2, max_queue_delay_s=5.0), beside=lambda rows: False
    )
    await batcher.start()
    await asyncio.wait_for(asyncio.gather(*(batcher.submit(rows(1, i)) for i in range(32))), 2.0)
    await batcher.close()
    assert execute.batches == [32]  # runs that hold the loop gain nothing from smaller batches


async def test_batcher_keeps_requests_apart_when_dynamic_batching_off() -> None:
    execute = Recorder(delay_s=0.005)
    batcher = await started(execute, max_batch_size=8, merge=False)
    await asyncio.gather(*(batcher.submit(rows(2, i)) for i in range(4)))
    await batcher.close()
    assert execute.batches == [2, 2, 2, 2]


async def test_batcher_fails_every_request_with_cause_when_batch_fails() -> None:
    execute = Recorder(delay_s=0.01, fail=True)
    batcher = await started(execute, max_batch_size=8, max_queue_delay_s=0.05)
    results = await asyncio.gather(*(batcher.submit(rows(1, i)) for i in range(3)), return_exceptions=True)
    execute.fail = False
    survivor = await batcher.submit(rows(1, 7))  # the worker outlives a failed batch
    await batcher.close()
    assert all(isinstance(r, InferenceFailed) and str(r) == "inference failed: kernel exploded" for r in results)
    np.testing.assert_array_equal(survivor["y"], rows(1, 7)["x"] * 2)


async def test_batcher_rejects_request_when_queue_full() -> None:
    execute = Recorder(delay_s=0.2)
    batcher = await started(execute, max_batch_size=1, max_queue_size=1)
    first = asyncio.create_task(batcher.submit(rows(1, 0)))
    assert await wait_until_async(lambda: execute.running == 1)  # first is executing, the queue is empty again
    second = asyncio.create_task(batcher.submit(rows(1, 1)))
    await asyncio.sleep(0)  # one loop turn: second is queued
    with pytest.raises(Overloaded, match=r"queue is full \(1 requests waiting\)"):
        await batcher.submit(rows(1, 2))
    await asyncio.gather(first, second)
    await batcher.close()


async def test_batcher_times_out_queued_request_when_default_timeout_passes() -> None:
    execute = Recorder(delay_s=0.5)  # runs well past the queued request's 30 ms
    batcher = await started(execute, max_batch_size=1, default_timeout_s=0.03)
    first = asyncio.create_task(batcher.submit(rows(1, 0)))
    assert await wait_until_async(lambda: execute.running == 1)
    with pytest.raises(DeadlineExceeded, match="deadline passed while it waited in the batch queue"):
        await batcher.submit(rows(1, 1))
    await first
    await batcher.close()
    assert execute.batches == [1]


async def test_batcher_rejects_model_answer_when_rows_do_not_match() -> None:
    async def truncating(inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
        return {"y": inputs["x"][:1]}, 0.0

    batcher = DynamicBatcher(truncating, BatchPolicy(max_batch_size=8))
    await batcher.start()
    with pytest.raises(InferenceFailed, match="output 'y' has 1 rows for a batch of 3"):
        await batcher.submit(rows(3, 0))
    await batcher.close()


async def test_batcher_drains_in_flight_work_when_asked() -> None:
    execute = Recorder(delay_s=0.05)
    batcher = await started(execute, max_batch_size=4)
    pending = asyncio.gather(*(batcher.submit(rows(1, i)) for i in range(3)))
    await asyncio.sleep(0)  # one loop turn: the three are queued
    await batcher.drain()
    assert sum(execute.batches) == 3
    assert execute.running == 0
    await batcher.close()
    assert len(await pending) == 3


@pytest.mark.slow  # wall-clock figures
async def test_batcher_reports_batches_to_observer_when_executed() -> None:
    seen: list[ExecutedBatch] = []
    batcher = DynamicBatcher(Recorder(delay_s=0.01), BatchPolicy(max_batch_size=4), seen.append)
    await batcher.start()
    await batcher.submit(rows(3, 0))
    await batcher.close()
    assert [(batch.rows, len(batch.waits)) for batch in seen] == [(3, 1)]
    assert seen[0].execute_s >= 0.005  # the runtime's time, apart from merging and splitting
    assert seen[0].merge_s >= 0
    assert seen[0].split_s >= 0


@pytest.mark.slow  # wall-clock figures; ~4 s of queue delays
async def test_batcher_skips_queue_delay_when_recent_batches_were_single_rows() -> None:
    execute = Recorder()
    # A delay long enough that skipping it stands out from a busy machine's scheduling delays.
    batcher = await started(execute, max_batch_size=32, max_queue_delay_s=0.2)
    loop = asyncio.get_running_loop()
    for i in range(30):  # a lone closed-loop client: nobody can join its batches
        await batcher.submit(rows(1, i))
    began = loop.time()
    await batcher.submit(rows(1, 99))
    lone = loop.time() - began
    await batcher.close()
    assert lone < 0.1
    assert set(execute.batches) == {1}


@pytest.mark.slow  # wall-clock figures; ~1.3 s of queue delays while the batch size settles
async def test_batcher_runs_a_closed_loops_batch_without_delay_once_it_is_as_big_as_recent_ones() -> None:
    """Eight clients in a closed loop: every batch holds all eight, and no ninth request will come. Once recent
    batches were that size, a batch of eight runs when the eighth arrives instead of idling out the delay."""
    execute = Recorder()
    batcher = await started(execute, max_batch_size=16, max_queue_delay_s=0.1)
    loop = asyncio.get_running_loop()
    rounds = []
    for i in range(25):  # the recent size falls from 16 to 8 as a moving average: ~13 batches
        began = loop.time()
        await asyncio.gather(*(batcher.submit(rows(1, 8 * i + k)) for k in range(8)))
        rounds.append(loop.time() - began)
    await batcher.close()
    assert execute.batches[-5:] == [8] * 5
    assert max(rounds[-5:]) < 0.05, rounds  # the delay (0.1 s) was not spent


@pytest.mark.slow  # wall-clock figures
async def test_batcher_always_waits_queue_delay_when_adaptive_delay_off() -> None:
    execute = Recorder()
    batcher = await started(execute, max_batch_size=32, max_queue_delay_s=0.02, adaptive_delay=False)
    loop = asyncio.get_running_loop()
    for i in range(3):
        began = loop.time()
        await batcher.submit(rows(1, i))
        assert loop.time() - began >= 0.015
    await batcher.close()


async def test_batcher_drain_waits_for_a_batch_being_formed_when_the_worker_holds_requests() -> None:
    """A worker that has taken requests off the queue and waits for company still owes them an answer: drain
    must wait for it, and close() after drain must not cancel it with the requests unanswered."""
    execute = Recorder()
    batcher = await started(execute, max_batch_size=8, max_queue_delay_s=0.2, adaptive_delay=False)
    pending = asyncio.create_task(batcher.submit(rows(1, 0.0)))
    # The worker took the request and now waits for the delay to pass.
    assert await wait_until_async(lambda: not batcher._queue)  # noqa: SLF001 - nothing public says it was taken
    await asyncio.wait_for(batcher.drain(), timeout=2.0)
    assert pending.done(), "drain returned while a worker still held a request"
    await batcher.close()
    np.testing.assert_array_equal((await pending)["y"], rows(1, 0.0)["x"] * 2)


async def test_batcher_close_answers_requests_held_by_a_forming_batch_when_closed_without_drain() -> None:
    execute = Recorder()
    batcher = await started(execute, max_batch_size=8, max_queue_delay_s=5.0, adaptive_delay=False)
    pending = asyncio.create_task(batcher.submit(rows(1, 0.0)))
    assert await wait_until_async(lambda: not batcher._queue)  # noqa: SLF001 - the forming batch holds it
    await batcher.close()
    with pytest.raises(GatewayError, match="unloaded") as caught:
        await asyncio.wait_for(pending, timeout=2.0)
    assert caught.value.status == 503


async def lone_request_seconds(worth_waiting: bool, adaptive_delay: bool) -> float:
    execute = Recorder()
    batcher = DynamicBatcher(
        execute,
        BatchPolicy(max_batch_size=32, max_queue_delay_s=0.3, adaptive_delay=adaptive_delay),
        worth_waiting=lambda rows, full: worth_waiting,
    )
    await batcher.start()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await batcher.submit(rows(1, 0))
    took = loop.time() - began
    await batcher.close()
    assert execute.batches == [1]
    return took


@pytest.mark.slow  # wall-clock figures
async def test_batcher_runs_without_queue_delay_when_company_would_not_be_cheaper_per_row() -> None:
    assert await lone_request_seconds(worth_waiting=False, adaptive_delay=True) < 0.15


@pytest.mark.slow  # wall-clock figures
async def test_batcher_spends_queue_delay_when_company_would_be_cheaper_per_row() -> None:
    assert await lone_request_seconds(worth_waiting=True, adaptive_delay=True) >= 0.25


@pytest.mark.slow  # wall-clock figures
async def test_batcher_spends_queue_delay_regardless_of_cost_when_adaptive_delay_off() -> None:
    assert await lone_request_seconds(worth_waiting=False, adaptive_delay=False) >= 0.25


async def batches_formed_while_one_runs(ahead: bool | None, adaptive_delay: bool = True) -> int:
    """Batches handed to ``execute`` while one instance's run is held, after a first batch let ``ahead`` speak."""
    gate = asyncio.Event()
    gate.set()
    handed: list[int] = []

    async def execute(inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
        handed.append(int(inputs["x"].shape[0]))
        await gate.wait()
        return {"y": inputs["x"] * 2}, 0.0

    policy = BatchPolicy(max_batch_size=4, instances=1, adaptive_delay=adaptive_delay)
    batcher = DynamicBatcher(execute, policy, ahead=None if ahead is None else lambda rows, full: ahead)
    await batcher.start()
    await batcher.submit(rows(1, 0))  # after it, the batcher asks ahead(1, 4)
    gate.clear()
    held = [asyncio.create_task(batcher.submit(rows(1, 1)))]
    assert await wait_until_async(lambda: len(handed) == 2)  # its batch runs, held at the gate
    held.append(asyncio.create_task(batcher.submit(rows(1, 2))))
    # A next batch forms within a few loop turns when allowed; when not, nothing comes in this bound either.
    await wait_until_async(lambda: len(handed) == 3, timeout_s=0.2)
    formed = len(handed) - 1
    gate.set()
    outputs = await asyncio.wait_for(asyncio.gather(*held), 2.0)
    await batcher.close()
    for i, output in zip((1, 2), outputs, strict=True):
        np.testing.assert_array_equal(output["y"], rows(1, i)["x"] * 2)
    return formed


async def test_batcher_hands_over_a_next_batch_while_one_runs_when_ahead_allows() -> None:
    assert await batches_formed_while_one_runs(ahead=True) == 2


async def test_batcher_holds_the_next_batch_until_the_instance_is_free_when_ahead_refuses() -> None:
    assert await batches_formed_while_one_runs(ahead=False) == 1
    assert await batches_formed_while_one_runs(ahead=None) == 1


async def test_batcher_forms_nothing_ahead_when_adaptive_delay_off() -> None:
    assert await batches_formed_while_one_runs(ahead=True, adaptive_delay=False) == 1


@pytest.mark.slow  # wall-clock figures
async def test_batcher_counts_the_wait_for_a_thread_as_queue_time_when_execute_reports_one() -> None:
    seen: list[ExecutedBatch] = []

    async def execute(inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
        await asyncio.sleep(0.3)  # the run, as the batcher times it
        return {"y": inputs["x"]}, 0.25  # 250 ms of the 300 were spent waiting for a thread

    batcher = DynamicBatcher(execute, BatchPolicy(max_batch_size=4), seen.append)
    await batcher.start()
    await batcher.submit(rows(1, 0))
    await batcher.close()
    assert seen[0].waits[0] >= 0.25
    assert seen[0].execute_s < 0.2  # 50 ms and the loop's lateness; 300 ms if the wait were counted as the run


async def test_a_closed_batcher_is_freed_by_reference_counting_when_its_owner_drops_it() -> None:
    """Its runtime session goes with it at once: a cycle through its cancelled worker tasks (their errors hold the
    workers' frames, which hold the batcher) kept an unloaded version's session alive until a full collection."""
    import gc
    import weakref

    class Session:
        async def __call__(self, inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
            return {"y": inputs["x"]}, 0.0

    session = Session()
    batcher = await started(session, max_batch_size=4, instances=2)  # type: ignore[arg-type]
    await batcher.submit(rows(1, 0.0))
    freed = weakref.ref(session)
    del session
    gc.disable()
    try:
        await batcher.close()
        del batcher
        await asyncio.sleep(0)  # the cancelled tasks' last callbacks
        assert freed() is None
    finally:
        gc.enable()
