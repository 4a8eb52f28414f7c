"""The tritonclient stream checks both backends' tests run (tests/integration/test_grpc_stream.py on the embedded
backend, tests/triton/test_grpc_stream_triton.py in front of Triton): many requests on one stream, every answer exact
and matched by id, an invalid request answered with its error while the stream goes on."""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from examples import models
from tests.gateway_harness import Reference, RunningGateway

REQUESTS = 1000
ROWS = 2


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


def sync_client_thousand_requests(gateway: RunningGateway, reference: Reference) -> None:
    """tritonclient's ``start_stream`` / ``async_stream_infer``: 1,000 requests and a malformed one in the middle."""
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


async def aio_client_requests(gateway: RunningGateway, reference: Reference) -> None:
    """The aio client's ``stream_infer``: 200 requests from an async generator."""
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
