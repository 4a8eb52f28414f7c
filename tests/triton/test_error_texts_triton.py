"""Triton's error texts and status codes with the Triton backend, over HTTP and gRPC: every row of
tests/error_texts.py (docs/protocol.md, "Error texts"), as on the embedded backend (the tests are
tests/error_text_cases.py's). A local Triton of its own: the rows that need a state of their own break a version and
unload the model, which the session's gateway must not see."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tritonlocal import TritonInstall
from tests.error_text_cases import (  # noqa: F401  (a fixture and tests pytest collects from here)
    source,
    test_answer_starts_with_tritons_text_and_status_when_the_request_is_wrong,
    test_failed_load_not_ready_version_and_unloaded_model_are_told_in_tritons_words,
)
from tests.gateway_harness import RunningGateway
from tests.triton.support import gateway_settings, local_gateway, local_triton

pytestmark = pytest.mark.slow  # a local Triton and a gateway on real ports


@pytest.fixture(scope="module")
def gateway(
    install: TritonInstall, source: Path, tmp_path_factory: pytest.TempPathFactory  # noqa: F811
) -> Iterator[RunningGateway]:
    with local_triton(source, tmp_path_factory.mktemp("error-texts-triton"), install) as triton:
        settings = gateway_settings(triton.grpc_url, source, repository_api_open=True, repository_poll_s=0)
        with local_gateway(settings) as running:
            yield running
