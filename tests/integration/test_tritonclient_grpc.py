"""tritonclient.grpc, unchanged, against the gateway's gRPC port (same process and loop as HTTP)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from examples import models
from tests.gateway_harness import Reference, RunningGateway

pytestmark = pytest.mark.slow  # a gateway on real ports


def test_grpc_client_reports_health_and_metadata_when_models_loaded(gateway: RunningGateway) -> None:
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("mlp", model_version="1")
        assert not client.is_model_ready("no-such-model")
        metadata = client.get_model_metadata("classifier", as_json=True)
        assert metadata["versions"] == ["1", "2"]
        assert metadata["inputs"] == [{"name": "image", "datatype": "FP32", "shape": ["-1", "3", "64", "64"]}]
        config = client.get_model_config("classifier", as_json=True)["config"]
        assert config["max_batch_size"] == 32
        assert client.get_server_metadata().name == "switchyard"


def test_grpc_client_returns_reference_outputs_when_version_pinned(
    gateway: RunningGateway, reference: Reference
) -> None:
    image = models.classifier_inputs(3, seed=21).numpy()
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        result = client.infer("classifier", [tensor], model_version="1", request_id="grpc-7")
    response = result.get_response()
    assert response.model_version == "1"
    assert response.id == "grpc-7"
    expected = reference("classifier", 1, {"image": image})["logits"]
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-4, atol=1e-5)


def test_grpc_infer_accepts_typed_contents_when_raw_contents_absent(
    gateway: RunningGateway, reference: Reference
) -> None:
    features = models.mlp_inputs(2, seed=4).numpy()
    request = service_pb2.ModelInferRequest(model_name="mlp", model_version="2")
    tensor = request.inputs.add(name="features", datatype="FP32", shape=[2, 32])
    tensor.contents.fp32_contents.extend(features.ravel().tolist())
    request.outputs.add(name="probabilities")
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert [o.name for o in response.outputs] == ["probabilities"]
    got = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(2, 8)
    expected = reference("mlp", 2, {"features": features})["probabilities"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("model", "version", "shape", "code", "message"),
    [
        ("nope", "", [1, 32], "StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found"),
        ("mlp", "9", [1, 32], "StatusCode.NOT_FOUND", "Request for unknown model: 'mlp' version 9 is not found"),
        ("mlp", "", [1, 31], "StatusCode.INVALID_ARGUMENT",
         "unexpected shape for input 'features' for model 'mlp'. Expected [-1,32], got [1,31]"),
        ("mlp", "", [33, 32], "StatusCode.INVALID_ARGUMENT", "inference request batch-size must be <= 32 for 'mlp'"),
    ],
)
def test_grpc_client_gets_matching_status_when_request_rejected(
    gateway: RunningGateway, model: str, version: str, shape: list[int], code: str, message: str
) -> None:
    data = np.zeros(shape, dtype=np.float32)
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        tensor = grpcclient.InferInput("features", shape, "FP32")
        tensor.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, [tensor], model_version=version)
    assert caught.value.status() == code
    assert message in caught.value.message()


def test_grpc_infer_rejects_raw_contents_when_length_mismatches(gateway: RunningGateway) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="features", datatype="FP32", shape=[1, 32])
    request.raw_input_contents.append(b"\0" * 100)
    with grpc.insecure_channel(gateway.grpc_url) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "input 'features': shape [1, 32] of FP32 needs 128 bytes, got 100"
