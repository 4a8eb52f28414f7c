"""One admission step for both protocols: the same request with the same key, priority and timeout gets the same
decision over REST and gRPC (status and gRPC code from the one table, the same message, the same counts), a gRPC
message over the size limit is refused and counted like a REST body, and a bug anywhere on the way is a counted
500 / ``INTERNAL`` naming a request id on both. A real gateway (embedded backend, real onnxruntime)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from pydantic import SecretStr
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.grpc_api.servicer import STATUS_CODES
from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.shaping_models import faulty_repository

pytestmark = pytest.mark.slow
KEY = "k-free-0123"
MAX_BODY = 4096
"""Bytes; 256 rows of ``faulty``'s four floats are 4 KiB of tensor data alone."""


@dataclass(frozen=True)
class Decision:
    status: int
    """REST's status, or the status whose gRPC code the call got (the one table, ``STATUS_CODES``)."""
    message: str
    request_id: str | None


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    root = tmp_path_factory.mktemp("parity")
    settings = Settings(
        repository=faulty_repository(root / "repository"),
        port=0,
        grpc_port=0,
        repository_poll_s=0,
        api_keys=SecretStr(f"{KEY}:free"),
        max_body_bytes=MAX_BODY,
        priority_levels=3,
        intra_op_threads=1,
    )  # type: ignore[call-arg]
    with running_gateway(settings) as running:
        yield running


@pytest.fixture(scope="module")
def channel(gateway: RunningGateway) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(gateway.grpc_url, options=[("grpc.max_send_message_length", 1 << 24)]) as opened:
        yield opened


def rest(gateway: RunningGateway, rows: int, headers: dict[str, str]) -> Decision:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": [0.0] * (rows * 4)}]}
    answer = httpx.post(f"http://{gateway.http_url}/v2/models/faulty/infer", content=json.dumps(body),
                        headers=headers, timeout=30)
    message = answer.json()["error"] if answer.status_code != 200 else ""
    return Decision(answer.status_code, message, answer.headers.get("x-request-id"))


def grpc_call(channel: grpc.Channel, rows: int, headers: dict[str, str]) -> Decision:
    request = service_pb2.ModelInferRequest(model_name="faulty")
    request.inputs.add(name="x", datatype="FP32", shape=[rows, 4])
    request.raw_input_contents.append(np.zeros((rows, 4), np.float32).tobytes())
    metadata = tuple((name.lower(), value) for name, value in headers.items())
    try:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        call: Any = exc
        status = next(s for s, code in STATUS_CODES.items() if code == call.code())
        trailers = dict(call.trailing_metadata() or ())
        return Decision(status, call.details(), trailers.get("x-request-id"))
    return Decision(200, "", None)


def counted(gateway: RunningGateway, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (every version, say)."""
    return sum(
        sample.value
        for family in gateway.registry.collect()
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


SAME_DECISIONS = {
    "no key": ({}, 1, 401),
    "unknown key": ({"X-API-Key": "k-nobody"}, 1, 401),
    "priority out of range": ({"X-API-Key": KEY, "X-Priority": "9"}, 1, 400),
    "priority not a number": ({"X-API-Key": KEY, "X-Priority": "high"}, 1, 400),
    "timeout not a number": ({"X-API-Key": KEY, "X-Request-Timeout": "soon"}, 1, 400),
    "deadline passed before queueing": ({"X-API-Key": KEY, "X-Request-Timeout": "0.000001"}, 1, 504),
    "priority and timeout within bounds": ({"X-API-Key": KEY, "X-Priority": "2", "X-Request-Timeout": "5000"}, 1, 200),
}
"""Case -> (headers / metadata, rows, REST status). Size refusals differ in their message only by the size named (a
JSON body against a protobuf message): ``test_too_large_is_decided_before_the_key_on_both``."""


@pytest.mark.parametrize("case", SAME_DECISIONS)
def test_rest_and_grpc_decide_alike_when_sent_the_same_key_priority_timeout_and_size(
    gateway: RunningGateway, channel: grpc.Channel, case: str
) -> None:
    headers, rows, want = SAME_DECISIONS[case]
    over_rest, over_grpc = rest(gateway, rows, headers), grpc_call(channel, rows, headers)
    assert over_rest.status == want, over_rest
    assert over_grpc == over_rest


def test_too_large_is_decided_before_the_key_on_both(gateway: RunningGateway, channel: grpc.Channel) -> None:
    over_rest, over_grpc = rest(gateway, 256, {}), grpc_call(channel, 256, {})
    assert (over_rest.status, over_grpc.status) == (413, 413)
    assert over_rest.message.startswith("request body of ")
    assert over_grpc.message.startswith("request message of ")
    assert over_rest.message.endswith(f" bytes exceeds the {MAX_BODY} byte limit")
    assert over_grpc.message.endswith(f" bytes exceeds the {MAX_BODY} byte limit")


def test_grpc_message_over_the_limit_is_refused_and_counted_as_rest_bodies_are(
    gateway: RunningGateway, channel: grpc.Channel
) -> None:
    before = {p: counted(gateway, "switchyard_requests_total", protocol=p, code="413") for p in ("http", "grpc")}
    rejected = counted(gateway, "switchyard_rejected_total", reason="too_large")
    refused = grpc_call(channel, 256, {"X-API-Key": KEY})
    assert refused.status == 413
    assert refused.message.endswith(f"bytes exceeds the {MAX_BODY} byte limit")
    assert rest(gateway, 256, {"X-API-Key": KEY}).status == 413
    assert counted(gateway, "switchyard_rejected_total", reason="too_large") == rejected + 2
    for protocol in ("http", "grpc"):
        assert counted(gateway, "switchyard_requests_total", protocol=protocol, code="413") == before[protocol] + 1


def test_an_exception_in_the_backend_is_a_counted_500_with_a_request_id_on_both(
    gateway: RunningGateway, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the runtime broke: /secret/path")

    monkeypatch.setattr(gateway.app.state.dataplane.backend, "infer", broken)
    _both_answer_a_counted_500(gateway, channel)


@pytest.mark.parametrize("edge", ["services.gateway.rest.lane", "services.gateway.grpc_api.servicer"])
def test_a_bug_in_encoding_the_answer_is_a_counted_500_with_a_request_id(
    gateway: RunningGateway, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch, edge: str
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the encoder broke: /secret/path")

    monkeypatch.setattr(f"{edge}.encode_response", broken)
    protocol = "http" if edge.endswith("lane") else "grpc"
    before = counted(gateway, "switchyard_requests_total", protocol=protocol, code="500")
    decision = rest(gateway, 1, {"X-API-Key": KEY}) if protocol == "http" else grpc_call(channel, 1, {"X-API-Key": KEY})
    _assert_internal(decision)
    assert counted(gateway, "switchyard_requests_total", protocol=protocol, code="500") == before + 1


def _both_answer_a_counted_500(gateway: RunningGateway, channel: grpc.Channel) -> None:
    before = {p: counted(gateway, "switchyard_requests_total", protocol=p, code="500") for p in ("http", "grpc")}
    _assert_internal(rest(gateway, 1, {"X-API-Key": KEY}))
    _assert_internal(grpc_call(channel, 1, {"X-API-Key": KEY}))
    for protocol in ("http", "grpc"):
        assert counted(gateway, "switchyard_requests_total", protocol=protocol, code="500") == before[protocol] + 1


def _assert_internal(decision: Decision) -> None:
    assert decision.status == 500, decision
    assert decision.request_id is not None
    assert len(decision.request_id) == 16
    assert decision.request_id in decision.message
    assert "secret" not in decision.message
