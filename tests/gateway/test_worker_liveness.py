"""A worker's sign of life (workers/liveness.py) and the steps that hold its event loop on purpose
(backends/loop_holds.py): what the supervisor's watchdog reads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from services.gateway.backends.loop_holds import LoopHolds
from services.gateway.workers.liveness import Liveness, now_ms


@pytest.fixture
def liveness(tmp_path: Path) -> Liveness:
    return Liveness.create(tmp_path / "liveness", 2)


def test_a_worker_that_never_beat_reads_as_starting_and_one_that_beat_as_silent_since(liveness: Liveness) -> None:
    worker = Liveness.attach(liveness.path, 2)  # the worker's own mapping of the supervisor's file
    try:
        assert liveness.silent_s(1) is None

        worker.beat(1)

        silent = liveness.silent_s(1, now=now_ms() + 5_000)
        assert silent is not None
        assert 4.9 <= silent <= 5.1
        assert liveness.silent_s(0) is None  # each worker has its own slot
    finally:
        worker.close()
        liveness.close()


def test_a_hold_allows_silence_for_its_allowance_and_its_release_counts_silence_from_then(liveness: Liveness) -> None:
    liveness.beat(0)
    liveness.hold(0, allowance_s=900)

    held = liveness.silent_s(0, now=now_ms() + 600_000)  # ten minutes into a load: not silent yet
    assert held is not None
    assert held < 0

    liveness.release(0)

    released = liveness.silent_s(0, now=now_ms() + 2_000)
    assert released is not None
    assert 1.9 <= released <= 2.1
    liveness.close()


def test_a_restarted_workers_slot_reads_as_starting_whatever_its_previous_process_wrote(liveness: Liveness) -> None:
    liveness.beat(1)
    liveness.hold(1)

    liveness.reset(1)

    assert liveness.silent_s(1) is None
    liveness.close()


def test_a_worker_index_outside_the_node_is_refused_naming_the_node_size(liveness: Liveness) -> None:
    with pytest.raises(IndexError, match="worker 2 has no liveness slot: the node has 2 workers"):
        liveness.beat(2)
    liveness.close()


def test_listeners_hear_when_the_first_hold_begins_and_the_last_ends_across_threads() -> None:
    holds = LoopHolds()
    heard: list[bool] = []
    stop = holds.listen(heard.append)
    first_in, second_in, first_may_end = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with holds.holding():
            first_in.set()
            first_may_end.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with holds.holding():  # a second load while the first runs
        second_in.set()
    assert heard == [True]  # the second's end is not the last: the first still holds the loop
    first_may_end.set()
    thread.join(10)

    assert heard == [True, False]
    stop()
    with holds.holding():
        pass
    assert heard == [True, False]


def test_a_listener_that_starts_during_a_hold_hears_it_at_once() -> None:
    holds = LoopHolds()
    heard: list[bool] = []
    with holds.holding():
        holds.listen(heard.append)
        assert heard == [True]
    assert heard == [True, False]


@pytest.mark.parametrize("timeout", [-1.0, 0.5, 1.9, float("nan")])
def test_a_hang_timeout_the_beat_would_trip_is_refused_naming_the_variable_and_the_range(
    tmp_path: Path, timeout: float
) -> None:
    from pydantic import ValidationError

    from services.gateway.settings import Settings

    with pytest.raises(ValidationError, match="SWITCHYARD_WORKER_HANG_TIMEOUT_S must be 0 .no watchdog. or at least 2"):
        Settings(repository=tmp_path, worker_hang_timeout_s=timeout)

    assert Settings(repository=tmp_path, worker_hang_timeout_s=0).worker_hang_timeout_s == 0
