"""What a gRPC client meets at the gateway's edge that the codec tests do not reach: answers larger than the request
limit, and bytes that are not a protobuf message of the method's type. Real gRPC on a real port, over the scripted
backend."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import numpy as np
import pytest
from asgi_lifespan import LifespanManager
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.app import create_app
from services.gateway.errors import InvalidInput
from services.gateway.grpc_api.codec import decode_request
from services.gateway.metrics import OTHER
from services.gateway.settings import Settings

ROWS = 8
LIMIT = 300
"""max_body_bytes for the tests of large answers: a request of 8 rows (128 bytes of data) fits, its answer (y and z,
256 bytes of data) does not."""
GARBAGE = b"\xff\xff\xff\xff\xff"
"""Not a protobuf message of any type: a field key that never ends."""
SERVICE = "/inference.GRPCInferenceService/"


@asynccontextmanager
async def gateway_channel(settings: Settings, registry: CollectorRegistry, **changes: object) -> AsyncIterator[Any]:
    """A channel to the gateway's real gRPC port (``settings`` with ``changes``), over the scripted backend."""
    changed = settings.model_copy(update={"grpc_port": 0, **changes})
    app = create_app(changed, backend=ScriptedBackend(), registry=registry)
    async with LifespanManager(app), grpc.aio.insecure_channel(f"127.0.0.1:{app.state.grpc_port}") as channel:
        yield channel


def _request(request_id: str = "") -> Any:
    message = service_pb2.ModelInferRequest(model_name="double", id=request_id)
    message.inputs.add(name="x", datatype="FP32", shape=[ROWS, 4])
    message.raw_input_contents.append(np.ones((ROWS, 4), np.float32).tobytes())
    return message


async def test_unary_answer_larger_than_the_request_limit_is_sent_whole(settings: Settings) -> None:
    async with gateway_channel(settings, CollectorRegistry(), max_body_bytes=LIMIT) as channel:
        request = _request()
        assert request.ByteSize() <= LIMIT
        answer = await service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert answer.ByteSize() > LIMIT
    y = np.frombuffer(answer.raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(y, np.full(ROWS * 4, 2.0, np.float32))


async def test_stream_answers_larger_than_the_request_limit_leave_the_stream_open(settings: Settings) -> None:
    async def requests() -> AsyncIterator[Any]:
        for index in range(3):
            yield _request(str(index))

    async with gateway_channel(settings, CollectorRegistry(), max_body_bytes=LIMIT) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        answers = [answer async for answer in call]
        code = await call.code()
    assert code == grpc.StatusCode.OK
    assert sorted(a.infer_response.id for a in answers) == ["0", "1", "2"]
    assert [a.error_message for a in answers] == ["", "", ""]


def _unparsed(message_type: str, size: int = len(GARBAGE)) -> str:
    return (
        f"the request message ({size} bytes) is not a serialized {message_type} (bytes that are not protobuf's wire "
        f"format, or a string field that is not UTF-8): Error parsing message with type '{message_type}'"
    )


async def _refusal(call: Any) -> tuple[grpc.StatusCode, str | None]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details()


NOT_UTF8 = b"\x0a\x02\xff\xfe"
"""A ``ModelInferRequest`` whose model_name (field 1) is two bytes that are not UTF-8, as a careless client of
another language may send."""


@pytest.mark.parametrize("message", [GARBAGE, NOT_UTF8], ids=["garbage", "not-utf8"])
async def test_model_infer_answers_invalid_argument_and_counts_it_when_the_message_does_not_parse(
    settings: Settings, message: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    async with gateway_channel(settings, registry) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=bytes, response_deserializer=bytes)
        with caplog.at_level(logging.ERROR):
            refusal = await _refusal(infer(message))
    assert refusal == (grpc.StatusCode.INVALID_ARGUMENT, _unparsed("inference.ModelInferRequest", len(message)))
    assert not caplog.records  # the client's mistake: no traceback in the gateway's log
    counted = {"model": OTHER, "version": "", "protocol": "grpc", "code": "400"}  # no model named: no model's count
    assert registry.get_sample_value("switchyard_requests_total", counted) == 1
    assert registry.get_sample_value("switchyard_rejected_total", {"model": OTHER, "reason": "invalid"}) == 1


async def test_stream_answers_a_message_that_does_not_parse_on_the_stream_and_serves_the_next(
    settings: Settings,
) -> None:
    async def requests() -> AsyncIterator[bytes]:
        yield GARBAGE
        yield _request("after").SerializeToString()

    async with gateway_channel(settings, CollectorRegistry()) as channel:
        stream = channel.stream_stream(
            SERVICE + "ModelStreamInfer", request_serializer=bytes,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )  # fmt: skip
        call = stream(requests())
        answers = [answer async for answer in call]
        code = await call.code()
    assert code == grpc.StatusCode.OK
    assert sorted((a.infer_response.id, a.error_message) for a in answers) == [
        ("", _unparsed("inference.ModelInferRequest")), ("after", "")
    ]


@pytest.mark.parametrize(
    ("path", "message_type"),
    [
        (SERVICE + "ModelMetadata", "inference.ModelMetadataRequest"),
        (SERVICE + "ModelReady", "inference.ModelReadyRequest"),
        (SERVICE + "SystemSharedMemoryRegister", "inference.SystemSharedMemoryRegisterRequest"),
        ("/grpc.health.v1.Health/Check", "grpc.health.v1.HealthCheckRequest"),
    ],
)
async def test_other_methods_answer_invalid_argument_when_the_message_does_not_parse(
    settings: Settings, path: str, message_type: str
) -> None:
    async with gateway_channel(settings, CollectorRegistry()) as channel:
        method = channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
        assert await _refusal(method(GARBAGE)) == (grpc.StatusCode.INVALID_ARGUMENT, _unparsed(message_type))


async def test_health_watch_answers_invalid_argument_when_the_message_does_not_parse(settings: Settings) -> None:
    async with gateway_channel(settings, CollectorRegistry()) as channel:
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch", request_serializer=bytes, response_deserializer=bytes
        )
        call = watch(GARBAGE)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        assert (caught.value.code(), caught.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, _unparsed("grpc.health.v1.HealthCheckRequest")
        )
        # a well-formed message on the same channel is served as before
        check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_decode_request_says_shared_memory_inputs_have_no_raw_entry_when_raw_contents_are_miscounted() -> None:
    request = service_pb2.ModelInferRequest(model_name="double")
    shared = request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    shared.parameters["shared_memory_region"].string_param = "inputs"
    shared.parameters["shared_memory_byte_size"].int64_param = 16
    request.raw_input_contents.append(bytes(16))  # x's data, sent as well
    with pytest.raises(InvalidInput) as caught:
        decode_request(request)
    assert str(caught.value) == (
        "raw_input_contents has 1 entries for 0 inputs: the inputs that name a shared-memory region ('x') have no "
        "entry there"
    )
