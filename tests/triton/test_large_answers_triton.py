"""Requests and answers to and from Triton larger than the gateway's request limit: the limit bounds what a client
sends the gateway, not what the gateway's own gRPC calls to Triton carry (a JSON request's BYTES grow by a length
prefix per element on the way; a model's outputs may be larger than its inputs)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_harness import RunningGateway
from tests.simple_models import copy_simple_repository, shared_simple_repository
from tests.triton.support import gateway_settings, local_gateway, local_triton

pytestmark = pytest.mark.slow  # an export, a local Triton and a gateway on real ports

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def identity_triton(install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    shared = shared_simple_repository(tmp_path_factory)
    repository = copy_simple_repository(shared, tmp_path_factory.mktemp("identity") / "repository",
                                        ("simple_identity",))
    with local_triton(repository, tmp_path_factory.mktemp("identity-triton"), install) as server:
        yield server


@pytest.fixture(scope="module")
def identity_gateway(identity_triton: LocalTriton) -> Iterator[RunningGateway]:
    settings = gateway_settings(identity_triton.grpc_url, identity_triton.source, max_body_bytes=LIMIT)
    with local_gateway(settings) as running:
        yield running


def test_a_request_within_the_limit_is_answered_when_its_call_to_triton_is_larger(
    identity_gateway: RunningGateway,
) -> None:
    """300,000 empty strings: a JSON body under 1 MiB, a gRPC request and answer of 1.2 MB (4 bytes of length each)."""
    count = 300_000
    body = {"inputs": [{"name": "INPUT0", "shape": [1, count], "datatype": "BYTES", "data": [""] * count}]}
    answer = httpx.post(f"http://{identity_gateway.http_url}/v2/models/simple_identity/infer", json=body, timeout=60)
    assert len(answer.request.content) < LIMIT
    assert answer.status_code == 200, answer.text[:300]
    output = answer.json()["outputs"][0]
    assert output["shape"] == [1, count]
    assert output["data"] == [""] * count
