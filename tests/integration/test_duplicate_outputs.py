"""An output named 1,000 times is answered once, as Triton does (issue #28, finding 6), on the embedded backend over
REST and gRPC; several names repeated keep the order in which each first came."""

from __future__ import annotations

import pytest

from tests.duplicate_outputs import TIMES, answered_names
from tests.gateway_harness import RunningGateway

pytestmark = pytest.mark.slow  # a gateway on real ports


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_infer_answers_each_output_once_when_request_names_it_many_times(
    gateway: RunningGateway, protocol: str
) -> None:
    urls = (gateway.http_url, gateway.grpc_url)
    assert answered_names(protocol, *urls, ["probabilities"] * TIMES) == ["probabilities"]
    repeated = ["probabilities", "logits", "probabilities", "logits", "logits"]
    assert answered_names(protocol, *urls, repeated) == ["probabilities", "logits"]
