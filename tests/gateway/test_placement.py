"""Placement: a tiny model's batches run on the event loop's thread, a long run goes to the worker threads."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from services.gateway.backends.placement import Placement, RunCost
from services.gateway.tensors.types import Array


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
            out, _ = await placement.execute({"x": np.ones((4, 2), np.float32)})
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


async def test_placement_never_runs_inline_a_model_whose_run_time_follows_its_data() -> None:
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(run_costing(0.0), pool, batching=True, inline_below_s=0.0002, steady=False)
        for _ in range(5):
            await placement.execute({"x": np.ones((1, 2), np.float32)})
    assert (placement.inline_runs, placement.thread_runs) == (0, 5)


async def test_placement_sends_rows_wider_than_any_measured_to_threads_first() -> None:
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(run_costing(0.00001), pool, batching=True, inline_below_s=0.0002)
        for _ in range(3):
            await placement.execute({"x": np.ones((2, 8), np.float32)})
        assert (placement.inline_runs, placement.thread_runs) == (2, 1)
        await placement.execute({"x": np.ones((1, 64), np.float32)})  # a longer sequence than seen: measured first
        assert (placement.inline_runs, placement.thread_runs) == (2, 2)
        await placement.execute({"x": np.ones((1, 64), np.float32)})
        await placement.execute({"x": np.ones((1, 16), np.float32)})  # no wider than one measured
        assert (placement.inline_runs, placement.thread_runs) == (4, 2)


async def test_placement_counts_text_rows_by_their_characters() -> None:
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(lambda inputs: inputs, pool, batching=True, inline_below_s=0.0002)
        for _ in range(3):
            await placement.execute({"text": np.array(["short"] * 2, dtype=object)})
        assert placement.thread_runs == 1
        await placement.execute({"text": np.array(["a far longer text than any seen before"], dtype=object)})
    assert placement.thread_runs == 2


async def test_placement_stops_inlining_after_a_run_overruns_its_budget(caplog: pytest.LogCaptureFixture) -> None:
    costs = iter([0.0, 0.0, 0.0, 0.02, 0.0, 0.0])

    def run(inputs: dict[str, Array]) -> dict[str, Array]:
        busy(next(costs))
        return inputs

    with ThreadPoolExecutor(1) as pool:
        placement = Placement(run, pool, batching=True, inline_below_s=0.0002, label="'loopy' version 1")
        for _ in range(6):
            await placement.execute({"x": np.ones((1, 2), np.float32)})
    assert (placement.inline_runs, placement.thread_runs) == (3, 3)  # measured, 2 inline, the overrun, then threads
    assert "model 'loopy' version 1: a batch of 1 row(s) expected to take under 200 us took" in caplog.text


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


def test_run_cost_saving_is_most_of_the_cost_when_runs_are_mostly_a_fixed_part() -> None:
    cost = RunCost()
    for _ in range(20):
        for rows in (1, 8, 32):
            cost.add(rows, 20e-6 + rows * 1e-6)
    saving = cost.saving(1, 32)
    assert saving is not None
    assert abs(saving - (1 - (52e-6 / 32) / 21e-6)) < 0.02


def test_run_cost_saving_is_unknown_when_one_batch_size_was_seen() -> None:
    cost = RunCost()
    for _ in range(20):
        cost.add(4, 40e-6)
    assert cost.saving(1, 32) is None


def run_costing_per_row(fixed_s: float, per_row_s: float):  # type: ignore[no-untyped-def]
    def run(inputs: dict[str, Array]) -> dict[str, Array]:
        busy(fixed_s + per_row_s * inputs["x"].shape[0])
        return {"y": inputs["x"] * 2}

    return run


async def placement_after_runs(fixed_s: float, per_row_s: float, inline_below_s: float = 0.0) -> Placement:
    """A placement after a few runs of 1, 4 and 8 rows; before them it waits for company and forms nothing ahead
    (nothing is known yet: Triton's way)."""
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(
            run_costing_per_row(fixed_s, per_row_s), pool, batching=True, inline_below_s=inline_below_s
        )
        assert placement.worth_waiting(1, 8)
        assert not placement.forms_ahead(4, 8)
        for _ in range(4):
            for rows in (1, 4, 8):
                await placement.execute({"x": np.ones((rows, 2), np.float32)})
    return placement


async def test_placement_stops_waiting_for_company_when_runs_cost_the_same_per_row() -> None:
    assert not (await placement_after_runs(0.0, 0.002)).worth_waiting(1, 8)


async def test_placement_keeps_waiting_for_company_when_runs_are_mostly_a_fixed_part() -> None:
    assert (await placement_after_runs(0.004, 0.0001)).worth_waiting(1, 8)


async def test_placement_forms_next_batch_ahead_when_runs_cost_the_same_per_row_on_threads() -> None:
    assert (await placement_after_runs(0.0, 0.002)).forms_ahead(4, 8)


async def test_placement_forms_no_batch_ahead_when_runs_are_mostly_a_fixed_part() -> None:
    assert not (await placement_after_runs(0.004, 0.0001)).forms_ahead(4, 8)


async def test_placement_forms_no_batch_ahead_when_its_runs_go_inline() -> None:
    placement = await placement_after_runs(0.0, 0.002, inline_below_s=1.0)
    assert placement.inline_runs > 0
    assert not placement.forms_ahead(4, 8)


async def test_placement_reports_the_wait_for_a_thread_when_a_batch_was_handed_over_behind_another() -> None:
    with ThreadPoolExecutor(1) as pool:
        # Runs of 200 ms: the second is handed over a little after the first starts, and on a loaded machine that
        # "little" has been 11 ms; the bound leaves it 100.
        placement = Placement(run_costing(0.2), pool, batching=True, inline_below_s=0.0)
        first, second = await asyncio.gather(
            placement.execute({"x": np.ones((1, 2), np.float32)}), placement.execute({"x": np.ones((1, 2), np.float32)})
        )
    assert first[1] < 0.05
    assert second[1] >= 0.1  # it waited for the first run, which the statistics count as its queue time


def placement_with_runs(fixed_s: float, per_row_s: float) -> Placement:
    """A placement that has seen runs costing ``fixed_s`` plus ``per_row_s`` a row (its pool is never used)."""
    with ThreadPoolExecutor(1) as pool:
        placement = Placement(run_costing(0.0), pool, batching=True, inline_below_s=0.0)
    for _ in range(20):
        for rows in (1, 8, 32):
            placement.cost.add(rows, fixed_s + rows * per_row_s)
    return placement


async def test_placement_goes_on_forming_ahead_when_its_own_smaller_batches_near_the_threshold() -> None:
    # A fixed part of 7% of a row: a batch of 1 would save about 6% per row in a full one, a batch of 8 under 1%.
    placement = placement_with_runs(0.07e-3, 1e-3)
    assert placement.cost.saving(1, 32) > 0.05  # so a batch of 1 alone does not start it
    assert not placement_with_runs(0.07e-3, 1e-3).forms_ahead(1, 32)
    assert placement.forms_ahead(8, 32)
    assert placement.forms_ahead(1, 32)  # started, it goes on
    assert not placement_with_runs(5e-3, 1e-3).forms_ahead(8, 32)  # company saves over a quarter: never
