"""Calls between a node's workers when one of them does not answer: a real Unix socket in the worker's place that
takes the connection and never answers (a worker that hangs, or is stopped)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway.workers.peers import Peers
from services.gateway.workers.place import WorkerPlace


@pytest.fixture
def silent_worker(tmp_path: Path) -> Iterator[WorkerPlace]:
    """Worker 0's place in a node of two whose worker 1 listens and never answers."""
    place = WorkerPlace(0, 2, tmp_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(place.socket_path(1)))
    listener.listen(8)  # the kernel takes the connection; nobody reads it, as in a stopped process
    try:
        yield place
    finally:
        listener.close()


async def test_a_worker_that_does_not_answer_is_left_out_and_logged_with_why(
    silent_worker: WorkerPlace, caplog: pytest.LogCaptureFixture
) -> None:
    peers = Peers(silent_worker)
    try:
        with caplog.at_level(logging.WARNING, "services.gateway.workers.peers"):
            assert await peers.answers("/peer/metrics", timeout_s=0.2) == []
    finally:
        await peers.close()
    assert caplog.messages == ["worker 1 left out of /peer/metrics: no answer within 0.2 s (ReadTimeout: the "
                               "worker is busy, hung or stopped)"]
