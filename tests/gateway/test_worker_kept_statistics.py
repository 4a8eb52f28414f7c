"""The statistics extension's node totals stay when a worker process dies or is silent (``kept_statistics.py``): real
statistics of the embedded backend's counters and the gateway's hops, real processes for the living and the dead."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.gateway.batching.batcher import ExecutedBatch
from services.gateway.statistics import Hops, StatisticsReport, VersionStatistics
from services.gateway.workers.kept_statistics import KeptStatistics, Report, report_json, versions_in
from services.gateway.workers.merge import merge_reports


def worker_report(requests: int, *, last_ms: int = 0, memory: int = 0, versions: tuple[int, ...] = (2,)) -> Report:
    """One worker's statistics of mlp ``versions`` after ``requests`` single-row requests (each its own batch)."""
    hops = Hops()
    found = []
    for version in versions:
        counters = VersionStatistics()
        for _ in range(requests):
            counters.executed(ExecutedBatch(rows=1, waits=[0.001], merge_s=0.0, execute_s=0.002, split_s=0.0))
            counters.succeeded(1, 0.004)
            hops.served("mlp", version, 0.004, 0.003)
        stats = counters.message("mlp", version)
        stats.last_inference = last_ms
        stats.memory_usage.add(type="CPU", id=0, byte_size=memory)
        found.append(stats)
    return report_json(StatisticsReport(found, [hops.json("mlp", v) for v in versions]))


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


def node_answer(this: KeptStatistics, local: Report, answered: dict[int, Report]) -> dict[str, Any]:
    """What ``NodeFigures.statistics`` merges: this worker's report, the answers, and the kept reports of the rest;
    mlp version 2's figures of the node."""
    this.keep_report(local)
    live = [local, *answered.values()]
    merged, gateway = merge_reports([*live, *this.reports(set(answered), versions_in(live))])
    stats = {(s.name, s.version): s for s in merged.model_stats}[("mlp", "2")]
    hop = {(h["name"], h["version"]): h for h in gateway}[("mlp", "2")]
    return {"inference": stats.inference_count, "executions": stats.execution_count,
            "success": stats.inference_stats.success.count, "batch_1": stats.batch_stats[0].compute_infer.count,
            "last": stats.last_inference, "memory": [m.byte_size for m in stats.memory_usage],
            "served": hop["success"]["count"]}


def test_a_dead_workers_counts_stay_in_the_node_statistics_and_its_memory_leaves_them(tmp_path: Path) -> None:
    this = KeptStatistics(tmp_path, 0)
    KeptStatistics(tmp_path, 1, pid=dead_pid()).keep_report(worker_report(5, last_ms=900, memory=1000))

    first = node_answer(this, worker_report(2, last_ms=100, memory=700), {})
    again = node_answer(this, worker_report(2, last_ms=100, memory=700), {})

    assert first == {"inference": 7, "executions": 7, "success": 7, "batch_1": 7, "last": 900, "memory": [700],
                     "served": 7}
    assert again == first  # folded once into the retired figures, not added again
    assert sorted(path.name for path in tmp_path.glob("*.stats")) == sorted([f"0-{this.pid}.stats", "retired.stats"])


def test_each_death_of_a_crashing_worker_adds_its_counts_once(tmp_path: Path) -> None:
    this = KeptStatistics(tmp_path, 0)
    for requests in (4, 6):  # worker 1 dies twice; each life's last report stays
        KeptStatistics(tmp_path, 1, pid=dead_pid()).keep_report(worker_report(requests))
        node_answer(this, worker_report(1), {})

    assert node_answer(this, worker_report(1), {})["success"] == 11
    assert list(tmp_path.glob("1-*.stats")) == []


def test_a_silent_living_worker_counts_by_its_last_report_and_an_answering_one_by_its_answer(
    tmp_path: Path, living: int
) -> None:
    this = KeptStatistics(tmp_path, 0)
    KeptStatistics(tmp_path, 1, pid=living).keep_report(worker_report(9, memory=500))

    silent = node_answer(this, worker_report(1, memory=700), {})
    answering = node_answer(this, worker_report(1, memory=700), {living: worker_report(12, memory=500)})

    assert (silent["success"], silent["served"], silent["memory"]) == (10, 10, [700])
    assert (answering["success"], answering["served"], answering["memory"]) == (13, 13, [1200])
    assert (tmp_path / f"1-{living}.stats").exists()  # alive: never folded into the retired figures


def test_a_version_no_living_worker_holds_leaves_the_retired_statistics_for_good(tmp_path: Path) -> None:
    this = KeptStatistics(tmp_path, 0)
    KeptStatistics(tmp_path, 1, pid=dead_pid()).keep_report(worker_report(5, versions=(1, 2)))
    assert node_answer(this, worker_report(1, versions=(1, 2)), {})["success"] == 6

    this.keep_report(worker_report(1, versions=(2,)))  # version 1 unloaded everywhere
    assert this.reports(set(), {("mlp", "2")})[0]["model_stats"][0]["version"] == "2"
    assert versions_in(this.reports(set(), {("mlp", "1"), ("mlp", "2")})) == {("mlp", "2")}  # loaded again: from 0
