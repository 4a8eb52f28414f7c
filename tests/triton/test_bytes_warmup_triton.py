"""BYTES models other tools made, through the gateway in front of the real local Triton (python-backend twins that
run the ONNX graphs with onnxruntime): served although the warm-up the gateway invents fails (noted in the index,
counted), and a declared ``model_warmup`` of strings that Triton itself runs at load: it warms the version up, or
Triton refuses the load and the gateway says why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tritonlocal import LocalTriton, TritonInstall
from tests.bytes_warmup_models import (
    ABSENT,
    DECIMALS,
    bytes_warmup_repository,
    expected_sums,
    grpc_add_sub,
    http_add_sub,
    identity,
    index,
)
from tests.gateway_harness import RunningGateway
from tests.simple_models import shared_simple_repository
from tests.string_models import TEXT
from tests.triton.support import gateway_settings, local_gateway, local_triton

pytestmark = pytest.mark.slow  # a local Triton
FAILURES = "switchyard_invented_warmup_failures_total"


@pytest.fixture(scope="module")
def bytes_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Without the model whose warm-up is answered with an error: it crashes this Triton (see bytes_warmup_models).
    simple = shared_simple_repository(tmp_path_factory)
    return bytes_warmup_repository(simple, tmp_path_factory.mktemp("bytes"), empty_strings=False)


@pytest.fixture(scope="module")
def bytes_gateway(
    install: TritonInstall, bytes_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    """Its own Triton: the declared model_warmup runs in Triton at load, before the gateway's own warm-up."""
    server: LocalTriton
    with local_triton(bytes_repository, tmp_path_factory.mktemp("bytes-triton"), install) as server:
        settings = gateway_settings(server.grpc_url, bytes_repository, repository_api_open=True)
        with local_gateway(settings) as running:
            yield running


@pytest.mark.parametrize("binary", [False, True])
def test_simple_string_adds_decimal_strings_through_triton_when_http_sends_json_or_binary(
    bytes_gateway: RunningGateway, binary: bool
) -> None:
    assert http_add_sub(bytes_gateway.http_url, "simple_string", binary=binary) == expected_sums()


@pytest.mark.parametrize("typed", [False, True])
def test_simple_string_adds_decimal_strings_through_triton_when_grpc_sends_raw_or_bytes_contents(
    bytes_gateway: RunningGateway, typed: bool
) -> None:
    assert grpc_add_sub(bytes_gateway.grpc_url, "simple_string", typed=typed) == expected_sums()


def test_simple_identity_answers_the_exact_strings_through_triton(bytes_gateway: RunningGateway) -> None:
    values = [t.encode() for t in TEXT]
    assert identity(bytes_gateway.grpc_url, values) == values
    assert "reason" not in index(bytes_gateway.http_url)["simple_identity"]


def test_failed_invented_warm_up_is_noted_and_counted_when_triton_serves_the_version(
    bytes_gateway: RunningGateway,
) -> None:
    entry = index(bytes_gateway.http_url)["simple_string"]
    assert entry["state"] == "READY"
    assert entry["reason"].startswith("serving without a full warm-up: warm-up request (zero-filled inputs")
    assert bytes_gateway.metric(FAILURES, model="simple_string") == 1
    assert bytes_gateway.metric(FAILURES, model="simple_identity") == 0


def test_declared_model_warmup_of_decimal_strings_warms_the_version_in_triton(bytes_gateway: RunningGateway) -> None:
    assert index(bytes_gateway.http_url)[DECIMALS] == {"name": DECIMALS, "version": "1", "state": "READY"}
    assert grpc_add_sub(bytes_gateway.grpc_url, DECIMALS, typed=True) == expected_sums()


def test_declared_model_warmup_that_fails_is_refused_by_triton_with_its_reason(bytes_gateway: RunningGateway) -> None:
    entry = index(bytes_gateway.http_url)[ABSENT]
    assert entry["state"] == "UNAVAILABLE"
    assert "failed to open text file for read" in entry["reason"]
    assert "absent.bin: No such file or directory" in entry["reason"]
    assert bytes_gateway.metric(FAILURES, model=ABSENT) == 0
