"""``ModelStreamInfer`` on the embedded backend: tritonclient's streams (tests/grpc_stream_cases.py), an unknown model
answered on the stream, the stream's bounds (in-flight limit, idle timeout), and an activation while a stream is
open."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.settings import Settings
from tests.gateway_harness import Reference, RunningGateway, running_gateway
from tests.grpc_stream_cases import ROWS, aio_client_requests, features, sync_client_thousand_requests

pytestmark = pytest.mark.slow  # a gateway on real ports

TOKEN = "stream-test-token"


def test_sync_client_gets_every_answer_of_a_thousand_requests_matched_by_id_and_an_error_mid_stream(
    gateway: RunningGateway, reference: Reference
) -> None:
    sync_client_thousand_requests(gateway, reference)


async def test_aio_client_streams_requests_and_matches_each_answer_by_id(
    gateway: RunningGateway, reference: Reference
) -> None:
    await aio_client_requests(gateway, reference)


def stream_request(index: int, model: str = "mlp") -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, model_version="1", id=str(index))
    request.inputs.add(name="features", datatype="FP32", shape=[ROWS, 32])
    request.raw_input_contents.append(features(index).tobytes())
    return request


def test_stream_answers_an_unknown_model_with_its_id_and_the_request_counts_like_a_unary_one(
    gateway: RunningGateway,
) -> None:
    refused = gateway.metric("switchyard_requests_total", model="_other", version="", protocol="grpc", code="404")
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter([stream_request(1, "nope"), stream_request(2)])))
    by_id = {answer.infer_response.id: answer for answer in answers}
    assert by_id["1"].error_message == "Request for unknown model: 'nope' is not found"
    assert not by_id["1"].infer_response.outputs
    assert by_id["2"].error_message == ""
    assert len(by_id["2"].infer_response.raw_output_contents) == 2
    assert gateway.metric("switchyard_requests_total", model="_other", version="", protocol="grpc",
                          code="404") == refused + 1


@pytest.fixture(scope="module")
def bounded(repository: Path) -> Iterator[RunningGateway]:
    """A gateway whose streams take 2 requests at once and end after 2 s idle (time for an activation)."""
    settings = Settings(repository=repository, port=0, grpc_port=0, stream_max_inflight=2, stream_idle_timeout_s=2,
                        admin_token=TOKEN)  # type: ignore[arg-type]
    with running_gateway(settings) as running:
        yield running


def test_a_stream_idle_past_its_timeout_ends_with_deadline_exceeded_saying_why(bounded: RunningGateway) -> None:
    def requests() -> Iterator[Any]:
        yield stream_request(1)
        ended.wait(10)  # the client says nothing more; the gateway ends the stream

    ended = threading.Event()
    with grpc.insecure_channel(bounded.grpc_url) as channel:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        first = next(stream)
        with pytest.raises(grpc.RpcError) as raised:
            next(stream)
        ended.set()
    assert first.infer_response.id == "1"
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "stream idle for 2 s (SWITCHYARD_STREAM_IDLE_TIMEOUT_S)" in str(raised.value.details())


async def test_a_stream_limited_to_two_requests_in_flight_answers_every_one_of_fifty(bounded: RunningGateway) -> None:
    """2 requests in flight at most: the gateway reads the third only once one is answered (tests/gateway/
    test_grpc_stream_bounds.py shows it), so a sender of 50 waits on gRPC's flow control; every one is answered."""
    count = 50
    async with grpc.aio.insecure_channel(bounded.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def requests() -> AsyncIterator[Any]:
            for index in range(count):
                yield stream_request(index)

        ids = [answer.infer_response.id async for answer in stub.ModelStreamInfer(requests())]
    assert sorted(ids, key=int) == [str(i) for i in range(count)]


async def test_a_stream_opened_before_an_activation_sends_its_later_requests_to_the_new_version(
    bounded: RunningGateway,
) -> None:
    admin = {"Authorization": f"Bearer {TOKEN}"}
    sent: asyncio.Queue[Any] = asyncio.Queue()

    async def requests() -> AsyncIterator[Any]:
        while (message := await sent.get()) is not None:
            yield message

    async with grpc.aio.insecure_channel(bounded.grpc_url) as channel, httpx.AsyncClient() as http:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
        answers = aiter(stream)
        before = []
        for index in range(5):
            sent.put_nowait(unversioned_request(index))
            before.append((await anext(answers)).infer_response.model_version)
        switched = await http.post(f"http://{bounded.http_url}/admin/models/mlp/versions/1/activate", headers=admin)
        assert switched.status_code == 200, switched.text
        after = []
        for index in range(5, 10):
            sent.put_nowait(unversioned_request(index))
            answer = await anext(answers)
            assert answer.error_message == ""
            after.append(answer.infer_response.model_version)
        sent.put_nowait(None)
        assert [answer async for answer in answers] == []
        back = await http.post(f"http://{bounded.http_url}/admin/models/mlp/versions/2/activate", headers=admin)
        assert back.status_code == 200, back.text
    assert (before, after) == (["2"] * 5, ["1"] * 5)


def unversioned_request(index: int) -> Any:
    request = stream_request(index)
    request.model_version = ""
    return request
