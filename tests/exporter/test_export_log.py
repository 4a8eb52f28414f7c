"""Quiet exports: the exporters' graphs and warnings go to a log in the repository's staging area, kept (and named
by the error) when the export fails, and shown on stderr only with ``--debug`` / ``verbose=True``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exporter import DataDependentControlFlowError, export
from exporter.repository import KEPT_LOGS, ModelRepository
from services.modelrepo.layout import EXPORT_LOGS_DIR
from tests.exporter import branching_models as models

ROOT = Path(__file__).parents[2]
# What torch.export and the tracer print about a data-dependent branch (FX graphs, shape-guard warnings).
DIAGNOSTICS = ("torch.ops.aten", "symbolic_shapes", "TracerWarning", "GuardOnDataDependentSymNode")


def cli_export(repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services", "export", "tests.exporter.branching_models:sign_model", "--name", "sign",
         "--repository", str(repo), "--max-batch-size", str(models.MAX_BATCH_SIZE["sign"]), *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
        env={**os.environ, models.EXAMPLE_VARIABLE: "3"},
    )


@pytest.mark.slow
def test_cli_export_prints_only_progress_when_the_exporters_are_chatty(repo: Path) -> None:
    done = cli_export(repo)

    assert done.returncode == 0, done.stderr
    assert "parity against eager PyTorch" in done.stderr
    assert [d for d in DIAGNOSTICS if d in done.stderr] == []
    assert not (repo / EXPORT_LOGS_DIR).exists()  # a successful export keeps no log


@pytest.mark.slow
def test_cli_export_shows_the_exporters_output_when_debug_is_set(repo: Path) -> None:
    done = cli_export(repo, "--debug")

    assert done.returncode == 0, done.stderr
    assert [d for d in DIAGNOSTICS if d in done.stderr] != []


@pytest.mark.slow  # exports models
def test_export_keeps_the_log_and_names_it_when_the_export_fails(repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    with pytest.raises(DataDependentControlFlowError) as caught:
        export(models.UnscriptableSignBranch().eval(), models.example(0), name="sign", repository=repo)

    log = caught.value.log_path
    assert log is not None
    assert log.parent == repo / EXPORT_LOGS_DIR
    assert log.name.startswith("sign-")
    assert f"the exporters' diagnostics are in {log}" in str(caught.value)
    assert "Converting a tensor to a Python boolean" in log.read_text()
    captured = capfd.readouterr()
    assert [d for d in DIAGNOSTICS if d in captured.err + captured.out] == []


@pytest.mark.slow  # exports models
def test_export_writes_the_exporters_output_to_stderr_when_verbose(
    repo: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    with pytest.raises(DataDependentControlFlowError) as caught:
        export(models.UnscriptableSignBranch().eval(), models.example(0), name="sign", repository=repo, verbose=True)

    assert caught.value.log_path is None
    assert "Converting a tensor to a Python boolean" in capfd.readouterr().err
    assert not (repo / EXPORT_LOGS_DIR).exists()


def test_keep_log_keeps_the_newest_logs_when_many_exports_fail(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path / "repository")
    repo.root.mkdir()
    kept = []
    for attempt in range(KEPT_LOGS + 5):
        log = tmp_path / f"export-{attempt}.log"
        log.write_text(f"attempt {attempt}\n")
        path = repo.keep_log(log, "m")
        assert path is not None
        os.utime(path, (attempt, attempt))  # distinct ages whatever the file system's clock resolution
        kept.append(path)

    remaining = sorted((repo.root / EXPORT_LOGS_DIR).iterdir())
    assert remaining == sorted(kept[-KEPT_LOGS:])
    empty = tmp_path / "empty.log"
    empty.touch()
    assert repo.keep_log(empty, "m") is None
