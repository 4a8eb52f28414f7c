"""Integration fixtures: a repository exported from the example models, and the gateway on real ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway.settings import Settings
from tests.gateway_harness import Reference, RunningGateway, onnx_reference, running_gateway


@pytest.fixture(scope="session")
def repository(example_repository: Path) -> Path:
    """classifier and mlp as ONNX versions 1 and 2 (policy ``all``), mlp_ts as TorchScript version 1."""
    return example_repository


@pytest.fixture(scope="session")
def gateway(repository: Path) -> Iterator[RunningGateway]:
    with running_gateway(Settings(repository=repository, port=0, grpc_port=0)) as running:
        yield running


@pytest.fixture(scope="session")
def reference(repository: Path) -> Reference:
    """Runs a repository version with onnxruntime directly: what the gateway must answer."""
    return onnx_reference(repository)
