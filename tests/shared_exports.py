"""The example models exported once per test run (``make models`` plus ``mlp_ts``), shared by every test that needs
them, also across pytest-xdist's workers: the first to come exports under a file lock, the others wait for it and
reuse the result. Tests read the shared copy and never write to it; one that changes a repository copies the
models it needs (``copy_examples``). ``Snapshot`` tells when a test broke that rule anyway."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.slow_work import slow_work

DONE = "exported.json"
"""Written last, with what ``export_examples`` wrote: a folder without it is an export that did not finish."""


@dataclass(frozen=True)
class SharedExamples:
    repository: Path
    """classifier and mlp as ONNX versions 1 and 2 (policy ``all``), mlp_ts as TorchScript version 1."""
    written: list[tuple[str, int]]
    """What ``export_examples`` returned for the empty repository: (name, version) in its order."""


def run_folder(factory: pytest.TempPathFactory) -> Path:
    """A folder this test run's processes share: the xdist workers' common parent, or this session's own temp
    folder without xdist (never pytest's global one, which other runs on the machine use too)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` (created): one process of the run at a time does what it guards."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shared_examples(factory: pytest.TempPathFactory) -> SharedExamples:
    """Export the examples unless this run already did (any worker), and return them."""
    folder = run_folder(factory) / "shared-examples"
    folder.mkdir(exist_ok=True)
    repository = folder / "model_repository"
    slow_work("uses the examples' export")
    with locked(folder / "lock"):
        if not (folder / DONE).exists():
            from examples import models  # torch: only for the test that exports
            from examples.export_examples import export_examples
            from exporter import export

            shutil.rmtree(repository, ignore_errors=True)  # a worker that died half way
            written = [(result.name, result.version) for result in export_examples(repository)]
            export(models.build_mlp(), models.mlp_inputs(2), name="mlp_ts", repository=repository,
                   format="torchscript")
            (folder / DONE).write_text(json.dumps(written))
    written = [(name, int(version)) for name, version in json.loads((folder / DONE).read_text())]
    return SharedExamples(repository, written)


def copy_examples(source: Path, target: Path, models: tuple[str, ...] = ("classifier", "mlp")) -> Path:
    """``models`` of ``source`` copied into ``target`` (created), for a test that writes to its repository."""
    for model in models:
        shutil.copytree(source / model, target / model)
    return target


class Snapshot:
    """Every file's path, size and modification time under a folder, to tell whether anything changed it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = self._read()

    def _read(self) -> dict[str, tuple[int, int]]:
        return {str(path.relative_to(self.root)): (path.stat().st_size, path.stat().st_mtime_ns)
                for path in sorted(self.root.rglob("*"))}

    def changes(self) -> list[str]:
        now = self._read()
        return sorted(name for name in self.files.keys() | now.keys() if self.files.get(name) != now.get(name))
