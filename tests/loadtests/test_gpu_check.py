"""`make gpu-check` (loadtests/gpu_check.py) on this CPU machine: the dry run end to end (``--device cpu``), and
``--device cuda`` refused with the reason where torch has no CUDA. The GPU run itself needs a lent GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.locust_runs import ROOT, loadtests_module

gpu_check = loadtests_module("gpu_check")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a torch without CUDA")
def test_cuda_asked_without_cuda_in_torch_exits_2_naming_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = gpu_check.main(["--device", "cuda", "--out", str(tmp_path)])

    report = capsys.readouterr()
    assert status == 2
    assert f"torch {torch.__version__} (CUDA no;" in report.out  # the environment report comes first
    assert f"--device cuda needs CUDA in torch, and torch {torch.__version__} sees no CUDA device" in report.err
    assert "onnxruntime on the lent GPU machines has no CUDAExecutionProvider" in report.err
    assert "pass --device cpu for the dry run" in report.err
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


@pytest.mark.parametrize(
    ("clients", "processes", "shares"),
    [(1, 4, [1]), (128, 4, [32, 32, 32, 32]), (5, 2, [3, 2]), (3, 8, [1, 1, 1])],
)
def test_clients_are_spread_evenly_over_the_client_processes_none_empty(
    clients: int, processes: int, shares: list[int]
) -> None:
    assert gpu_check.client_shares(clients, processes) == shares


@pytest.mark.parametrize("text", ["", "1,x", "0,4", "4,-1"])
def test_client_counts_other_than_positive_integers_are_refused(text: str) -> None:
    with pytest.raises(SystemExit) as refused:
        gpu_check.parse_args(["--clients", text])

    assert refused.value.code == 2


@pytest.mark.slow
def test_the_cpu_dry_run_checks_parity_and_measures_every_run_with_1_and_2_workers(tmp_path: Path) -> None:
    command = [sys.executable, "loadtests/gpu_check.py", "--device", "cpu", "--seconds", "0.5", "--workers", "2",
               "--clients", "1,4", "--out", str(tmp_path)]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)

    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (figures["passed"], figures["failures"], figures["device"]) == (True, [], "cpu")
    assert [(p["workers"], p["batch_sizes"], p["passed"]) for p in figures["parity"]] == [
        (1, [1, 3, 32, 128], True), (2, [1, 3, 32, 128], True)
    ]
    assert [(t["workers"], t["clients"]) for t in figures["throughput"]] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert all(t["requests"] > 0 and t["requests_per_s"] > 0 for t in figures["throughput"])
    assert {batch: rate > 0 for batch, rate in figures["ceiling_images_per_s"].items()} == {
        "1": True, "32": True, "128": True
    }
    assert 0 < figures["cache_charged_mb"] < gpu_check.CACHE_MB  # the pinned model loaded, torch charged to no model
    assert "gateway, 2 worker(s), 4 clients" in done.stdout
    assert "passed; figures in" in done.stdout
    for workers in (1, 2):  # the logs come back beside the figures, each instance's device in them
        assert "(1 instance(s) on cpu" in (tmp_path / f"gateway-{workers}w.log").read_text()
