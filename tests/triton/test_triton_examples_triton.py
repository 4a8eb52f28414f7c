"""Triton's example clients' sequences (tests/triton_examples.py) against the gateway in front of a local Triton of
its own serving Triton's ``simple`` models (the BYTES ones in their python-backend twins), with shared memory and the
open repository API switched on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_harness import RunningGateway
from tests.simple_models import copy_simple_repository, shared_simple_repository
from tests.triton.support import gateway_settings, local_gateway, local_triton
from tests.triton_examples import SEQUENCE_SETTINGS, SEQUENCES, run_sequence

pytestmark = pytest.mark.slow  # an export, a local Triton and a gateway on real ports


@pytest.fixture(scope="module")
def simple_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shared build: the model-control sequences load and unload in it."""
    shared = shared_simple_repository(tmp_path_factory)
    return copy_simple_repository(shared, tmp_path_factory.mktemp("simple") / "repository")


@pytest.fixture(scope="module")
def simple_triton(
    install: TritonInstall, simple_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTriton]:
    with local_triton(simple_repository, tmp_path_factory.mktemp("simple-triton"), install) as server:
        yield server


@pytest.fixture(scope="module")
def simple_gateway(simple_triton: LocalTriton, simple_repository: Path) -> Iterator[RunningGateway]:
    with local_gateway(gateway_settings(simple_triton.grpc_url, simple_repository, **SEQUENCE_SETTINGS)) as running:
        yield running


@pytest.mark.parametrize("sequence", list(SEQUENCES))
async def test_example_client_sequence_passes_when_run_against_the_triton_backend(
    simple_gateway: RunningGateway, sequence: str
) -> None:
    await run_sequence(sequence, simple_gateway.http_url, simple_gateway.grpc_url)
