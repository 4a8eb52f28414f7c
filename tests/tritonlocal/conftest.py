"""Fixtures for the local-Triton tests: a real exporter repository and a real tritonserver on free ports.

Without an install (``make install``) the server tests are skipped, except under ``CI`` where that is
a failure: CI must run them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_harness import onnx_reference
from tests.tritonlocal.support import Reference, require_install

MODELS = ("classifier", "mlp", "mlp_ts")


@pytest.fixture(scope="session")
def install() -> TritonInstall:
    return require_install()


@pytest.fixture(scope="session")
def repository(example_repository: Path) -> Path:
    """classifier and mlp as ONNX versions 1 and 2 (policy ``all``), mlp_ts as TorchScript version 1."""
    return example_repository


@pytest.fixture(scope="package")
def triton(install: TritonInstall, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """One server for this package's tests in a test process, with every model loaded (all versions) over gRPC. Package
    scope: it stops once the process moves on to other tests, not at the end of the run (its python stubs hold a
    dozen processes and their /dev/shm regions)."""
    work = tmp_path_factory.mktemp("triton")
    server = LocalTriton(repository, derived=work / "derived", install=install, log_file=work / "tritonserver.log")
    started = time.monotonic()
    with server:
        ready_s = time.monotonic() - started
        for model in MODELS:
            server.load(model)
        print(f"tritonserver ready in {ready_s:.2f} s, models loaded after {time.monotonic() - started:.2f} s")
        yield server


@pytest.fixture(scope="session")
def reference(repository: Path) -> Reference:
    """Runs a version's model.onnx with onnxruntime in this process: what Triton must answer."""
    return onnx_reference(repository)
