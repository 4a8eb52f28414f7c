"""The error-text tests both backends run: each test file imports this fixture and these tests and supplies
``gateway`` (embedded, or in front of a local Triton of its own) with the repository API open on ``source``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.error_texts import STATELESS, ErrorCase, check_grpc, check_http, check_stateful_rows, scenario_repository
from tests.gateway_harness import RunningGateway


@pytest.fixture(scope="module")
def source(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_repository(repository, tmp_path_factory)


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
