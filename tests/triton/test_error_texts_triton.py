"""Triton's error texts and status codes with the Triton backend, over HTTP and gRPC: the rows of tests/error_texts.py
that leave the session gateway as it is. The repository API's rows run on the embedded backend only
(tests/integration/test_error_texts.py): it refuses them before any backend is asked, and it is closed here."""

from __future__ import annotations

import pytest

from tests.error_texts import STATELESS, ErrorCase, grpc_answer, http_answer
from tests.gateway_harness import RunningGateway

pytestmark = pytest.mark.slow  # the session's local Triton and a gateway on real ports

ROUTED = tuple(case for case in STATELESS if case.call.kind not in ("load", "unload"))


@pytest.mark.parametrize("case", ROUTED, ids=lambda case: case.case)
def test_answer_starts_with_tritons_text_and_status_when_the_request_is_wrong(
    gateway: RunningGateway, case: ErrorCase
) -> None:
    status, text = http_answer(gateway.http_url, case.call)
    assert (status, text[: len(case.text)]) == (case.http_status, case.text), text
    if case.grpc_code:
        code, message = grpc_answer(gateway.grpc_url, case.call)
        assert (code, message[: len(case.text)]) == (case.grpc_code, case.text), message
