"""Triton's error texts and status codes on the embedded backend, over HTTP and gRPC: every row of
tests/error_texts.py (docs/protocol.md, "Error texts"), the rows that need a state of their own in one scenario."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway import Settings
from tests.error_texts import (
    STATELESS,
    ErrorCase,
    check_grpc,
    check_http,
    check_stateful_rows,
    scenario_repository,
)
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports


@pytest.fixture(scope="module")
def source(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_repository(repository, tmp_path_factory)


@pytest.fixture(scope="module")
def gateway(source: Path) -> Iterator[RunningGateway]:
    settings = Settings(repository=source, port=0, grpc_port=0, repository_api_open=True, repository_poll_s=0)
    with running_gateway(settings) as running:
        yield running


@pytest.mark.parametrize("case", STATELESS, ids=lambda case: case.case)
def test_answer_starts_with_tritons_text_and_status_when_the_request_is_wrong(
    gateway: RunningGateway, case: ErrorCase
) -> None:
    check_http(gateway.http_url, case)
    check_grpc(gateway.grpc_url, case)


def test_failed_load_not_ready_version_and_unloaded_model_are_told_in_tritons_words(
    gateway: RunningGateway, source: Path
) -> None:
    check_stateful_rows(gateway.http_url, gateway.grpc_url, source)
