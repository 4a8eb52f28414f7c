"""tritonclient.http and tritonclient.http.aio, unchanged, against the gateway on a real port."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

from examples import models
from services.gateway.tensors.types import Array
from tests.gateway_harness import Reference, RunningGateway

pytestmark = pytest.mark.slow  # a gateway on real ports


def _features(batch: int, seed: int) -> Array:
    return models.mlp_inputs(batch, seed).numpy()


def test_http_client_reports_health_and_metadata_when_models_loaded(gateway: RunningGateway) -> None:
    client = httpclient.InferenceServerClient(gateway.http_url)
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("classifier")
        assert client.is_model_ready("mlp", model_version="2")
        assert not client.is_model_ready("mlp", model_version="7")
        server = client.get_server_metadata()
        assert server["name"] == "switchyard"
        assert server["grpc_port"] == gateway.grpc_port  # the gateway's own key, which tritonclient passes through
        metadata = client.get_model_metadata("mlp")
        assert metadata["versions"] == ["1", "2"]
        assert metadata["platform"] == "onnxruntime_onnx"
        assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 32]}]
        assert [o["name"] for o in metadata["outputs"]] == ["logits", "probabilities"]
        assert client.get_model_metadata("classifier", model_version="1")["versions"] == ["1"]
        config = client.get_model_config("classifier")
        assert config["max_batch_size"] == 32
        assert config["input"][0]["name"] == "image"
    finally:
        client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_client_returns_reference_outputs_when_inferring(
    gateway: RunningGateway, reference: Reference, binary: bool
) -> None:
    features = _features(3, seed=5)
    client = httpclient.InferenceServerClient(gateway.http_url)
    try:
        tensor = httpclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("probabilities", "logits")]
        result = client.infer("mlp", [tensor], outputs=outputs, request_id=f"req-{binary}")
    finally:
        client.close()
    expected = reference("mlp", 2, {"features": features})
    response = result.get_response()
    assert response["id"] == f"req-{binary}"
    assert response["model_version"] == "2"  # unversioned requests go to the highest loaded version
    assert [o["name"] for o in response["outputs"]] == ["probabilities", "logits"]
    np.testing.assert_allclose(result.as_numpy("logits"), expected["logits"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-5, atol=1e-6)


def test_http_client_gets_each_version_when_version_pinned(gateway: RunningGateway, reference: Reference) -> None:
    image = models.classifier_inputs(2, seed=3).numpy()
    client = httpclient.InferenceServerClient(gateway.http_url)
    try:
        results = {}
        for version in ("1", "2"):
            tensor = httpclient.InferInput("image", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            results[version] = client.infer("classifier", [tensor], model_version=version)
    finally:
        client.close()
    for version, result in results.items():
        assert result.get_response()["model_version"] == version
        expected = reference("classifier", int(version), {"image": image})["logits"]
        np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(results["1"].as_numpy("logits"), results["2"].as_numpy("logits"))


def test_http_infer_names_version_in_header_when_answering(gateway: RunningGateway) -> None:
    body = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.5] * 32}]}
    response = httpx.post(f"http://{gateway.http_url}/v2/models/mlp/versions/1/infer", json=body)
    assert response.status_code == 200
    assert response.headers["X-Model-Version"] == "1"
    assert response.json()["model_version"] == "1"
    assert "id" not in response.json()


async def test_http_aio_client_returns_reference_outputs_when_inferring(
    gateway: RunningGateway, reference: Reference
) -> None:
    features = _features(4, seed=9)
    client = aiohttpclient.InferenceServerClient(gateway.http_url)
    try:
        assert await client.is_server_ready()
        assert await client.is_model_ready("mlp", model_version="1")
        tensor = aiohttpclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        result = await client.infer("mlp", [tensor], model_version="1", request_id="aio-1")
    finally:
        await client.close()
    assert result.get_response()["id"] == "aio-1"
    assert result.get_response()["model_version"] == "1"
    expected = reference("mlp", 1, {"features": features})
    np.testing.assert_allclose(result.as_numpy("logits"), expected["logits"], rtol=1e-5, atol=1e-6)


def test_metrics_endpoint_exposes_switchyard_series_when_requests_served(gateway: RunningGateway) -> None:
    body = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.1] * 32}]}
    assert httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", json=body).status_code == 200
    text = httpx.get(f"http://{gateway.http_url}/metrics").text
    for name in (
        'switchyard_requests_total{code="200",model="mlp",protocol="http",version="2"}',
        "switchyard_request_duration_seconds_bucket",
        "switchyard_backend_duration_seconds_bucket",
        "switchyard_queue_wait_seconds_bucket",
        "switchyard_inflight_requests",
        "switchyard_batch_size_bucket",
        'switchyard_active_version{model="classifier"} 2.0',
    ):
        assert name in text
