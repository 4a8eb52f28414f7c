"""The dynamic batcher under real concurrent clients: fewer executions than requests, own rows back."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as aiohttpclient

from examples import models
from services.gateway.tensors.types import Array
from tests.gateway_harness import Reference, RunningGateway

pytestmark = pytest.mark.slow  # a gateway on real ports


async def test_batcher_merges_requests_and_splits_rows_when_32_clients_concurrent(
    gateway: RunningGateway, reference: Reference
) -> None:
    # Batches of 1-3 rows each, so merging and splitting must respect every request's own offsets.
    images = [models.classifier_inputs(1 + i % 3, seed=100 + i).numpy() for i in range(32)]
    executions = gateway.metric("switchyard_batch_size_count", model="classifier")
    client = aiohttpclient.InferenceServerClient(gateway.http_url, conn_limit=32)

    async def one(image: Array, index: int) -> tuple[str, Array]:
        tensor = aiohttpclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        result = await client.infer("classifier", [tensor], model_version="1", request_id=str(index))
        return result.get_response()["id"], result.as_numpy("logits")

    try:
        answers = await asyncio.gather(*(one(image, i) for i, image in enumerate(images)))
    finally:
        await client.close()
    executed = gateway.metric("switchyard_batch_size_count", model="classifier") - executions
    assert 1 <= executed < len(images)
    for index, (request_id, logits) in enumerate(answers):
        assert request_id == str(index)
        expected = reference("classifier", 1, {"image": images[index]})["logits"]
        assert logits.shape == expected.shape
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


async def test_batcher_serves_grpc_clients_when_concurrent(gateway: RunningGateway, reference: Reference) -> None:
    batches = [models.mlp_inputs(2, seed=200 + i).numpy() for i in range(32)]
    executions = gateway.metric("switchyard_batch_size_count", model="mlp")
    async with grpcaio.InferenceServerClient(gateway.grpc_url) as client:

        async def one(features: Array) -> Array:
            tensor = grpcaio.InferInput("features", list(features.shape), "FP32")
            tensor.set_data_from_numpy(features)
            result = await client.infer("mlp", [tensor], model_version="2")
            probabilities: Array = result.as_numpy("probabilities")
            return probabilities

        answers = await asyncio.gather(*(one(f) for f in batches))
    assert gateway.metric("switchyard_batch_size_count", model="mlp") - executions < len(batches)
    for features, probabilities in zip(batches, answers, strict=True):
        expected = reference("mlp", 2, {"features": features})["probabilities"]
        np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-6)
