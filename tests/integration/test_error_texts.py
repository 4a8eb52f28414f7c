"""Triton's error texts and status codes on the embedded backend, over HTTP and gRPC: every row of
tests/error_texts.py (docs/protocol.md, "Error texts"), the rows that need a state of their own in one scenario
(the tests are tests/error_text_cases.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway.settings import Settings
from tests.error_text_cases import (  # noqa: F401  (a fixture and tests pytest collects from here)
    source,
    test_answer_starts_with_tritons_text_and_status_when_the_request_is_wrong,
    test_failed_load_not_ready_version_and_unloaded_model_are_told_in_tritons_words,
)
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports


@pytest.fixture(scope="module")
def gateway(source: Path) -> Iterator[RunningGateway]:  # noqa: F811  (source is the imported fixture)
    settings = Settings(repository=source, port=0, grpc_port=0, repository_api_open=True, repository_poll_s=0)
    with running_gateway(settings) as running:
        yield running
