"""``ModelStreamInfer`` on the embedded backend through tritonclient, unchanged: many requests on one stream, every
answer exact and matched by id, an invalid request answered with its error while the stream goes on; the stream's
bounds (in-flight limit, idle timeout) and its figures."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from examples import models
from services.gateway.settings import Settings
from tests.gateway_harness import Reference, RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports

REQUESTS = 1000
ROWS = 2
TOKEN = "stream-test-token"


def features(index: int) -> np.ndarray:
    """Request ``index``'s rows: distinct per request, so that a swapped answer cannot pass."""
    return models.mlp_inputs(ROWS, seed=index).numpy()


def infer_input(module: Any, rows: np.ndarray) -> Any:
    tensor = module.InferInput("features", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return tensor


def expected_outputs(reference: Reference, count: int) -> dict[str, np.ndarray]:
    """Every request's probabilities from onnxruntime directly, in one batch."""
    batch = np.concatenate([features(i) for i in range(count)])
    return {str(i): row for i, row in enumerate(reference("mlp", 1, {"features": batch})["probabilities"].reshape(
        count, ROWS, -1))}


def test_sync_client_gets_every_answer_of_a_thousand_requests_matched_by_id_and_an_error_mid_stream(
    gateway: RunningGateway, reference: Reference
) -> None:
    expected = expected_outputs(reference, REQUESTS)
    answers: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
    opened = gateway.metric("switchyard_open_streams", protocol="grpc")
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index in range(REQUESTS):
            client.async_stream_infer("mlp", [infer_input(grpcclient, features(index))], model_version="1",
                                      request_id=str(index))
            if index == REQUESTS // 2:  # a 16-wide row where 32 are expected: its own error, the stream goes on
                bad = grpcclient.InferInput("features", [1, 16], "FP32")
                bad.set_data_from_numpy(np.zeros((1, 16), np.float32))
                client.async_stream_infer("mlp", [bad], model_version="1", request_id="bad")
        got: dict[str, np.ndarray] = {}
        errors = []
        for _ in range(REQUESTS + 1):
            result, error = answers.get(timeout=60)
            if error is not None:
                errors.append(str(error))
                continue
            response = result.get_response()
            assert (response.model_name, response.model_version) == ("mlp", "1")
            assert response.parameters["triton_final_response"].bool_param
            got[response.id] = result.as_numpy("probabilities")
        client.stop_stream()
    assert errors == ["unexpected shape for input 'features' for model 'mlp'. Expected [-1,32], got [1,16]; model "
                      "'mlp' batches (max_batch_size 32): the first dimension is the batch size"]
    assert sorted(got) == sorted(expected)
    for request_id, probabilities in got.items():
        np.testing.assert_allclose(probabilities, expected[request_id], rtol=1e-5, atol=1e-6)
    assert gateway.metric("switchyard_open_streams", protocol="grpc") == opened  # ended and counted down


async def test_aio_client_streams_requests_and_matches_each_answer_by_id(
    gateway: RunningGateway, reference: Reference
) -> None:
    count = 200
    expected = expected_outputs(reference, count)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for index in range(count):
            yield {"model_name": "mlp", "model_version": "1", "request_id": str(index),
                   "inputs": [infer_input(aioclient, features(index))]}

    got = {}
    async with aioclient.InferenceServerClient(gateway.grpc_url) as client:
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("probabilities")
    assert sorted(got, key=int) == [str(i) for i in range(count)]
    for request_id, probabilities in got.items():
        np.testing.assert_allclose(probabilities, expected[request_id], rtol=1e-5, atol=1e-6)


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
