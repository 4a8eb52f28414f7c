"""``ModelStreamInfer`` through the gateway in front of the session's local Triton: tritonclient's streams, the same
checks as on the embedded backend (tests/grpc_stream_cases.py)."""

from __future__ import annotations

import pytest

from tests.gateway_harness import Reference, RunningGateway
from tests.grpc_stream_cases import aio_client_requests, sync_client_thousand_requests

pytestmark = pytest.mark.slow  # a local Triton


def test_sync_client_gets_every_answer_of_a_thousand_requests_through_triton_matched_by_id(
    gateway: RunningGateway, reference: Reference
) -> None:
    sync_client_thousand_requests(gateway, reference)


async def test_aio_client_streams_requests_through_triton_and_matches_each_answer_by_id(
    gateway: RunningGateway, reference: Reference
) -> None:
    await aio_client_requests(gateway, reference)
