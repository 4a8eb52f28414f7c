"""tritonclient (HTTP and gRPC) -> gateway (backend=triton) -> real Triton: outputs, versions, batching."""

from __future__ import annotations

import asyncio
from itertools import product

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from services.tritonlocal import LocalTriton
from tests.duplicate_outputs import TIMES, answered_names
from tests.gateway_harness import Reference, RunningGateway
from tests.triton.support import MODELS, statistics
from tests.tritonlocal.support import sample

pytestmark = pytest.mark.slow  # a local Triton

CASES = list(product(MODELS, (1, 2)))


@pytest.mark.parametrize(("model", "version"), CASES)
def test_http_client_gets_onnxruntime_outputs_when_gateway_forwards_to_triton(
    gateway: RunningGateway, reference: Reference, model: str, version: int
) -> None:
    inputs = sample(model, rows=3, seed=version)
    expected = reference(model, version, inputs)
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        tensors = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            tensors.append(tensor)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in expected]
        result = client.infer(model, tensors, model_version=str(version), outputs=outputs)
    assert result.get_response()["model_version"] == str(version)
    for name, want in expected.items():
        np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("model", "version"), CASES)
def test_grpc_client_gets_onnxruntime_outputs_when_gateway_forwards_to_triton(
    gateway: RunningGateway, reference: Reference, model: str, version: int
) -> None:
    inputs = sample(model, rows=2, seed=10 + version)
    expected = reference(model, version, inputs)
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensors = []
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        result = client.infer(model, tensors, model_version=str(version), request_id=f"{model}-{version}")
    response = result.get_response()
    assert (response.model_version, response.id) == (str(version), f"{model}-{version}")
    for name, want in expected.items():
        np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-5, atol=1e-6)


def test_unversioned_request_is_served_by_highest_version_when_both_are_loaded(
    gateway: RunningGateway, reference: Reference
) -> None:
    features = sample("mlp", rows=1, seed=3)["features"]
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        result = client.infer("mlp", [tensor])
    assert result.get_response().model_version == "2"
    np.testing.assert_allclose(
        result.as_numpy("logits"), reference("mlp", 2, {"features": features})["logits"], rtol=1e-5, atol=1e-6
    )


def test_version_not_loaded_in_triton_is_404_when_pinned(gateway: RunningGateway) -> None:
    features = sample("mlp", rows=1)["features"]
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        tensor = httpclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("mlp", [tensor], model_version="3")
    assert caught.value.status() == "404"


def test_gateway_reports_triton_state_when_models_are_loaded(gateway: RunningGateway, triton: LocalTriton) -> None:
    assert triton.model_states("mlp") == {1: "READY", 2: "READY"}
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        assert client.is_server_ready()
        assert client.is_model_ready("classifier", model_version="1")
        assert not client.is_model_ready("classifier", model_version="3")
        metadata = client.get_model_metadata("classifier", as_json=True)
        assert metadata["versions"] == ["1", "2"]
        assert metadata["inputs"] == [{"name": "image", "datatype": "FP32", "shape": ["-1", "3", "64", "64"]}]
        config = client.get_model_config("mlp", model_version="2", as_json=True)["config"]
    assert config["max_batch_size"] == 32
    assert config["version_policy"] == {"specific": {"versions": ["1", "2"]}}


async def test_triton_batches_requests_when_32_clients_call_the_gateway_at_once(
    gateway: RunningGateway, triton: LocalTriton
) -> None:
    before = statistics(triton, "mlp", 1)
    client = grpcaio.InferenceServerClient(gateway.grpc_url)

    async def one(seed: int) -> None:
        features = sample("mlp", rows=1, seed=seed)["features"]
        tensor = grpcaio.InferInput("features", [1, 32], "FP32")
        tensor.set_data_from_numpy(features)
        result = await client.infer("mlp", [tensor], model_version="1")
        assert result.as_numpy("logits").shape == (1, 8)

    try:
        for wave in range(3):
            await asyncio.gather(*(one(wave * 32 + i) for i in range(32)))
    finally:
        await client.close()
    after = statistics(triton, "mlp", 1, at_least=before["inference_count"] + 96)
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 96
    assert executions < inferences, f"{executions} executions for {inferences} requests: Triton did not batch"
    print(f"Triton ran 96 requests in {executions} batches")


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_triton_backend_answers_each_output_once_when_request_names_it_many_times(
    gateway: RunningGateway, protocol: str
) -> None:
    """Issue #28, finding 6: as Triton itself answers."""
    urls = (gateway.http_url, gateway.grpc_url)
    assert answered_names(protocol, *urls, ["probabilities"] * TIMES) == ["probabilities"]
    assert answered_names(protocol, *urls, ["logits", "probabilities", "logits"]) == ["logits", "probabilities"]
