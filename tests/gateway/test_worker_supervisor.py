"""The supervisor of ``serve --workers N`` when a worker dies: a real supervisor (its ports, folder and node share),
a real process that exits standing in for the worker."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway.settings import Settings
from services.gateway.shaping.node_share import NodeShare, NodeSlots
from services.gateway.workers.liveness import Liveness
from services.gateway.workers.place import WorkerPlace
from services.gateway.workers.supervisor import Supervisor, _Worker
from tests.waiting import wait_until

HANG_TIMEOUT_S = 2.0


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    found = Supervisor(Settings(repository=tmp_path, host="127.0.0.1", port=0, grpc_port=None, workers=2,
                                worker_hang_timeout_s=HANG_TIMEOUT_S))
    try:
        yield found
    finally:
        found.close()


def test_a_dead_workers_concurrency_slots_are_freed_when_it_dies_not_when_it_restarts(supervisor: Supervisor) -> None:
    share = NodeShare.attach(WorkerPlace(1, 2, supervisor.folder).share_path, 1)
    try:
        held = NodeSlots(share, "mlp")
        assert held.try_take(limit=2)
        assert held.try_take(limit=2)  # worker 1 executes the model's two slots of the node when it is killed
        process = multiprocessing.get_context("spawn").Process(target=sys.exit, args=(9,))
        process.start()
        process.join(60)
        dead = _Worker(1, process)
        supervisor._workers[1] = dead

        supervisor._tend()  # sees it dead: its restart is due after the backoff

        assert dead.due is not None
        assert dead.restarts == 1
        assert NodeSlots(share, "mlp").executing == 0  # the other workers may take them during the backoff
    finally:
        share.close()


def beat_once_then_stall(liveness_path: Path, holding: bool) -> None:
    """A worker whose event loop beat once, then stopped turning (``holding``: inside a load that holds it)."""
    liveness = Liveness.attach(liveness_path, 2)
    liveness.beat(1)
    if holding:
        liveness.hold(1)
    time.sleep(600)


def stalled_worker(supervisor: Supervisor, holding: bool) -> _Worker:
    liveness = Liveness.attach(WorkerPlace(1, 2, supervisor.folder).liveness_path, 2)
    try:
        process = multiprocessing.get_context("spawn").Process(
            target=beat_once_then_stall, args=(WorkerPlace(1, 2, supervisor.folder).liveness_path, holding)
        )
        process.start()
        assert wait_until(lambda: liveness.silent_s(1) is not None, 60)  # it beat
    finally:
        liveness.close()
    worker = _Worker(1, process)
    supervisor._workers[1] = worker
    return worker


def test_a_worker_silent_past_the_hang_timeout_is_killed_and_its_restart_scheduled(supervisor: Supervisor) -> None:
    worker = stalled_worker(supervisor, holding=False)
    try:
        supervisor._tend()
        assert worker.process.is_alive()  # silent for less than the timeout so far

        assert wait_until(lambda: (supervisor._tend(), not worker.process.is_alive())[1], 10 * HANG_TIMEOUT_S)

        assert worker.process.exitcode == -signal.SIGKILL
        assert worker.hung_s is not None
        assert worker.hung_s > HANG_TIMEOUT_S
        assert (worker.restarts, worker.due is not None) == (1, True)
    finally:
        worker.process.kill()


def test_a_worker_silent_inside_a_load_that_holds_its_loop_is_left_alone(supervisor: Supervisor) -> None:
    worker = stalled_worker(supervisor, holding=True)
    try:
        until = time.monotonic() + 2 * HANG_TIMEOUT_S
        while time.monotonic() < until:  # twice the timeout, the whole of it silent
            supervisor._tend()
            time.sleep(0.2)

        assert worker.process.is_alive()
        assert (worker.hung_s, worker.restarts) == (None, 0)
    finally:
        worker.process.kill()
