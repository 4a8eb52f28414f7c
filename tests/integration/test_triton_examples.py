"""Triton's example clients' sequences (tests/triton_examples.py) against the gateway on the embedded backend,
serving Triton's ``simple`` models with shared memory and the open repository API switched on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.simple_models import copy_simple_repository, shared_simple_repository
from tests.triton_examples import SEQUENCE_SETTINGS, SEQUENCES, run_sequence

pytestmark = pytest.mark.slow  # an export and a gateway on real ports


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shared build: the model-control sequences load and unload in it."""
    shared = shared_simple_repository(tmp_path_factory)
    return copy_simple_repository(shared, tmp_path_factory.mktemp("simple") / "repository")


@pytest.fixture(scope="module")
def gateway(repository: Path) -> Iterator[RunningGateway]:
    settings = Settings(repository=repository, port=0, grpc_port=0, **SEQUENCE_SETTINGS)  # type: ignore[arg-type]
    with running_gateway(settings) as running:
        yield running


@pytest.mark.parametrize("sequence", list(SEQUENCES))
async def test_example_client_sequence_passes_when_run_against_the_embedded_backend(
    gateway: RunningGateway, sequence: str
) -> None:
    await run_sequence(sequence, gateway.http_url, gateway.grpc_url)
