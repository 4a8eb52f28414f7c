"""The KServe SDK tests both backends run: each test file imports these fixtures and tests, and its directory's
conftest supplies ``gateway`` (embedded, or in front of the package's Triton) and ``reference``."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.gateway_harness import Reference, RunningGateway
from tests.kserve_sdk import SDK_PYTHON, assert_answer, features_request, request_arrays, run_sdk

PROTOCOLS = ("rest", "grpc")


@pytest.fixture(scope="module")
def request_json(reference: Reference) -> dict[str, Any]:
    request = features_request(rows=3, seed=5)
    request["outputs"] = sorted(reference("mlp", 1, request_arrays(request)))
    return request


@pytest.fixture(scope="module")
def report(gateway: RunningGateway, request_json: dict[str, Any]) -> dict[str, Any]:
    """Every SDK call, run once for the module. Without the SDK's environment the tests skip, except under ``CI``,
    where that fails them."""
    if not SDK_PYTHON.exists():
        reason = f"no KServe SDK environment ({SDK_PYTHON} is missing): run `make install`"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {reason}", pytrace=False)
        pytest.skip(reason)
    return run_sdk(gateway.http_url, gateway.grpc_url, request_json)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_kserve_sdk_reads_health_when_gateway_ready(report: dict[str, Any], protocol: str) -> None:
    health = report[protocol]
    assert (health["live"], health["ready"]) == (True, True)
    assert (health["model_ready"], health["unknown_model_ready"]) == (True, False)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("encoding", ["infer_json", "infer_binary"])
def test_kserve_sdk_infers_reference_outputs_when_tensors_are_json_or_binary(
    report: dict[str, Any], request_json: dict[str, Any], reference: Reference, protocol: str, encoding: str
) -> None:
    answer = report[protocol][encoding]
    assert "error" not in answer, answer["error"]  # what the SDK raised
    assert_answer(answer, reference("mlp", int(answer["model_version"]), request_arrays(request_json)))
