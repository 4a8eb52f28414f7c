"""Atomic publication: a killed export leaves no version folder, and the next export recovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from examples.models import build_mlp, mlp_inputs
from exporter import export
from exporter.repository import ModelRepository
from services.modelrepo.layout import STAGING_PREFIX
from tests.exporter.helpers import listing

# Runs an export in a child process and SIGKILLs it from inside the publish step, after the
# version is fully staged and before it is moved into place: the worst moment to crash.
CRASHING_EXPORT = textwrap.dedent(
    """
    import os, signal, sys
    import exporter.repository as repository
    from examples.models import build_mlp, mlp_inputs
    from exporter import export

    def crash(root):
        os.kill(os.getpid(), signal.SIGKILL)

    repository._fsync_tree = crash
    export(build_mlp(), mlp_inputs(2), name="mlp", repository=sys.argv[1], input_names=["features"])
    """
)


def run_crashing_export(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CRASHING_EXPORT, str(repo)], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2], timeout=300, check=False)


@pytest.mark.slow  # exports models
def test_publish_leaves_no_model_when_first_export_is_killed(repo: Path) -> None:
    crashed = run_crashing_export(repo)

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert ModelRepository(repo).versions("mlp") == []
    assert not (repo / "mlp").exists()
    assert [p.name for p in repo.iterdir() if p.name.startswith(STAGING_PREFIX)]  # the crash left its staging

    result = export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])

    assert result.version == 1
    assert not [p for p in repo.iterdir() if p.name.startswith(STAGING_PREFIX)]


@pytest.mark.slow  # exports models
def test_publish_keeps_existing_versions_when_next_export_is_killed(repo: Path) -> None:
    export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])
    before = [p for p in listing(repo) if not p.startswith(STAGING_PREFIX)]

    crashed = run_crashing_export(repo)

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert ModelRepository(repo).versions("mlp") == [1]
    assert [p for p in listing(repo) if not p.split("/")[0].startswith(STAGING_PREFIX)] == before


def test_staging_is_kept_when_its_owner_is_alive(repo: Path) -> None:
    repo.mkdir(parents=True)
    live = repo / f"{STAGING_PREFIX}{os.getpid()}-inflight"
    live.mkdir()

    with ModelRepository(repo).staging() as mine:
        assert mine.exists()

    assert live.exists()
    assert not mine.exists()
