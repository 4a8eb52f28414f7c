"""The supervisor of ``serve --workers N`` when a worker dies: a real supervisor (its ports, folder and node share),
a real process that exits standing in for the worker."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway.settings import Settings
from services.gateway.shaping.node_share import NodeShare, NodeSlots
from services.gateway.workers.place import WorkerPlace
from services.gateway.workers.supervisor import Supervisor, _Worker


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    found = Supervisor(Settings(repository=tmp_path, host="127.0.0.1", port=0, grpc_port=None, workers=2))
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
