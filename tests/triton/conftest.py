"""Fixtures for the Triton backend tests: the example models (the session's export), a real local Triton (CPU,
python backend) started empty in explicit mode, and the gateway with ``backend="triton"`` in front of it (both for
the package's tests in one test process).

Without a local Triton install (``make install``) these tests are skipped, except under ``CI``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_harness import Reference, RunningGateway, onnx_reference
from tests.shared_exports import copy_examples
from tests.triton.support import gateway_settings, local_gateway, local_triton
from tests.tritonlocal.support import require_install


@pytest.fixture(scope="session")
def install() -> TritonInstall:
    return require_install()


@pytest.fixture(scope="session")
def repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """classifier and mlp, versions 1 and 2 each (policy ``all``), exactly as ``make models`` writes them: a copy of
    the session's export, without ``mlp_ts``."""
    return copy_examples(example_repository, tmp_path_factory.mktemp("model_repository"))


@pytest.fixture(scope="session")
def reference(repository: Path) -> Reference:
    return onnx_reference(repository)


@pytest.fixture(scope="package")
def triton(install: TritonInstall, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """Started empty (explicit mode, nothing loaded): the gateway's backend loads what the policies select. Package
    scope: the test process that runs this package's shared-server files (tests/xdist_groups.py) stops it once it
    moves on to other tests, not at the end of the run (its python stubs hold processes and /dev/shm regions)."""
    with local_triton(repository, tmp_path_factory.mktemp("triton"), install) as server:
        yield server


@pytest.fixture(scope="package")
def gateway(triton: LocalTriton, repository: Path) -> Iterator[RunningGateway]:
    started = time.monotonic()
    with local_gateway(gateway_settings(triton.grpc_url, repository)) as running:
        print(f"gateway (backend=triton) up with all versions loaded in {time.monotonic() - started:.1f} s")
        yield running
