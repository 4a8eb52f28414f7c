"""``SWITCHYARD_WORKERS=0``: one worker per core the process may use, within a container's CPU limit."""

from __future__ import annotations

import os
from pathlib import Path

from services.gateway.workers.supervisor import worker_count

CORES = len(os.sched_getaffinity(0))


def test_a_worker_count_asked_for_is_kept(tmp_path: Path) -> None:
    assert worker_count(3, tmp_path / "absent") == 3


def test_zero_is_one_worker_per_core_without_a_cpu_limit(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert worker_count(0, tmp_path / "cpu.max") == CORES
    assert worker_count(0, tmp_path / "absent") == CORES


def test_zero_rounds_a_containers_cpu_limit_up_within_the_cores(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core
    assert worker_count(0, tmp_path / "cpu.max") == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * (CORES + 4)} 100000\n")  # more than the machine has
    assert worker_count(0, tmp_path / "cpu.max") == CORES
