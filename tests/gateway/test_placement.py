"""Placement: a tiny model's batches run on the event loop's thread, a long run goes to the worker threads."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from services.gateway.backends.placement import Placement, RunCost
from services.gateway.types import Array


def busy(seconds: float) -> None:
    """CPU time, not sleep: the placement measures thread CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def run_costing(seconds: float):  # type: ignore[no-untyped-def]
    def run(inputs: dict[str, Array]) -> dict[str, Array]:
        busy(seconds)
        return {"y": inputs["x"] * 2}

    return run


async def test_placement_runs_batches_inline_when_a_run_costs_less_than_the_bound() -> None:
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(run_costing(0.00001), pool, batching=True, inline_below_s=0.0002)
        for _ in range(20):
            out = await placement.execute({"x": np.ones((4, 2), np.float32)})
            np.testing.assert_array_equal(out["y"], np.full((4, 2), 2.0, np.float32))
    assert placement.thread_runs == 1  # the first, which measured the cost
    assert placement.inline_runs == 19


async def test_placement_sends_batches_to_threads_when_a_run_costs_more_than_the_bound() -> None:
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(run_costing(0.002), pool, batching=True, inline_below_s=0.0002)
        for _ in range(5):
            await placement.execute({"x": np.ones((4, 2), np.float32)})
    assert placement.inline_runs == 0
    assert placement.thread_runs == 5


async def test_placement_never_runs_inline_when_the_bound_is_zero() -> None:
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(run_costing(0.0), pool, batching=True, inline_below_s=0.0)
        for _ in range(5):
            await placement.execute({"x": np.ones((1, 2), np.float32)})
    assert (placement.inline_runs, placement.thread_runs) == (0, 5)


def test_run_cost_fits_fixed_and_per_row_parts_when_batch_sizes_vary() -> None:
    cost = RunCost()
    for _ in range(200):
        for rows in (1, 8, 32):
            cost.add(rows, 20e-6 + rows * 1e-6)
    assert abs(cost.seconds(16) - 36e-6) < 2e-6
    assert abs(cost.seconds(1) - 21e-6) < 2e-6


def test_run_cost_scales_up_with_rows_when_one_batch_size_was_seen() -> None:
    cost = RunCost()
    cost.add(1, 50e-6)
    assert cost.seconds(1) == 50e-6
    assert cost.seconds(4) == 200e-6
