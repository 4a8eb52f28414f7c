"""A worker process's reported counters stay in the node's sums once it dies or while it is silent (``kept.py``):
real expositions of GatewayMetrics, real processes for the living and the dead."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from test_worker_merge import Series, exposition, samples, series

from services.gateway.metrics import GatewayMetrics
from services.gateway.workers.kept import RETIRED, KeptFigures
from services.gateway.workers.merge import merge_metrics

OK = series("switchyard_requests_total", model="mlp", version="2", protocol="http", code="200")
WAITING = series("switchyard_admission_waiting", model="mlp")


def worker_text(served: int, waiting: int) -> str:
    metrics = GatewayMetrics(CollectorRegistry())
    metrics.served("mlp", 2, "http").ok.inc(served)
    metrics.queued.labels("mlp").set(waiting)
    return exposition(metrics)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def living() -> Iterator[int]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def node_sum(this: KeptFigures, local: str, answered: dict[int, str]) -> dict[Series, float]:
    """What ``NodeFigures.metrics`` merges: this worker's text, the answers, and the kept figures of the rest."""
    this.keep(local)
    return samples(merge_metrics([local, *answered.values(), *this.others(set(answered))]))


def test_a_dead_workers_counters_stay_in_the_node_sum_and_its_gauges_leave_it(tmp_path: Path) -> None:
    this = KeptFigures(tmp_path, 0)
    KeptFigures(tmp_path, 1, pid=dead_pid()).keep(worker_text(served=5, waiting=3))

    first = node_sum(this, worker_text(served=2, waiting=1), {})
    again = node_sum(this, worker_text(served=2, waiting=1), {})

    assert (first[OK], first[WAITING]) == (7, 1)  # 5 from the dead worker, none of its requests waiting
    assert again == first  # folded once into the retired figures, not added again
    assert sorted(path.name for path in tmp_path.glob("*.prom")) == sorted([f"0-{this.pid}.prom", RETIRED])


def test_each_death_of_a_crashing_worker_adds_its_counts_to_one_retired_file(tmp_path: Path) -> None:
    this = KeptFigures(tmp_path, 0)
    for served in (4, 6):  # worker 1 dies twice; each life's last report stays
        KeptFigures(tmp_path, 1, pid=dead_pid()).keep(worker_text(served=served, waiting=0))
        node_sum(this, worker_text(served=1, waiting=0), {})

    assert node_sum(this, worker_text(served=1, waiting=0), {})[OK] == 11
    assert len(list(tmp_path.glob("1-*.prom"))) == 0


def test_a_silent_living_worker_counts_by_its_last_report_and_an_answering_one_by_its_answer(
    tmp_path: Path, living: int
) -> None:
    this = KeptFigures(tmp_path, 0)
    other = KeptFigures(tmp_path, 1, pid=living)
    other.keep(worker_text(served=9, waiting=2))

    silent = node_sum(this, worker_text(served=1, waiting=0), {})
    answering = node_sum(this, worker_text(served=1, waiting=0), {living: worker_text(served=12, waiting=2)})

    assert (silent[OK], silent[WAITING]) == (10, 0)
    assert (answering[OK], answering[WAITING]) == (13, 2)  # counted once, by its answer
    assert (tmp_path / f"1-{living}.prom").exists()  # alive: never folded into the retired figures
