"""Inference through system shared memory with tritonclient (HTTP, HTTP aio, gRPC, gRPC aio) against the embedded
backend: the same answers as the request-body path, and 400 / INVALID_ARGUMENT for slices that do not fit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from examples import models
from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.shm_support import ShmObject, shm_object
from tests.string_models import TEXT, serialized, string_repository

pytestmark = pytest.mark.slow  # a gateway on real ports

ROWS = 3
FEATURES = ROWS * 32 * 4
SCORES = ROWS * 8 * 4


@pytest.fixture(scope="module")
def gateway(repository: Path) -> Iterator[RunningGateway]:
    with running_gateway(Settings(repository=repository, port=0, grpc_port=0, shared_memory=True)) as running:
        yield running


@pytest.fixture
def region() -> Iterator[ShmObject]:
    """Features at 0, logits after them, probabilities after those."""
    with shm_object(FEATURES + 2 * SCORES) as found:
        yield found


def body_answer(gateway: RunningGateway, features: np.ndarray) -> dict[str, np.ndarray]:
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
        tensor.set_data_from_numpy(features)
        result = client.infer("mlp", [tensor], model_version="1")
    return {name: result.as_numpy(name) for name in ("logits", "probabilities")}


def test_shared_memory_http_infer_matches_body_path_when_inputs_and_outputs_in_regions(
    gateway: RunningGateway, region: ShmObject
) -> None:
    features = models.mlp_inputs(ROWS, seed=11).numpy()
    region.put(features)
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        client.register_system_shared_memory("scores", region.key, 2 * SCORES, offset=FEATURES)
        try:
            tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES)
            logits = httpclient.InferRequestedOutput("logits")
            logits.set_shared_memory("scores", SCORES)
            probabilities = httpclient.InferRequestedOutput("probabilities")
            probabilities.set_shared_memory("scores", SCORES, offset=SCORES)
            result = client.infer("mlp", [tensor], model_version="1", outputs=[logits, probabilities])
        finally:
            client.unregister_system_shared_memory()
    expected = body_answer(gateway, features)
    output = result.get_output("logits")
    assert output["shape"] == [ROWS, 8]
    assert "data" not in output
    assert output["parameters"] == {
        "shared_memory_region": "scores", "shared_memory_offset": 0, "shared_memory_byte_size": SCORES
    }
    assert result.get_output("probabilities")["parameters"]["shared_memory_offset"] == SCORES
    np.testing.assert_array_equal(region.get(np.float32, [ROWS, 8], FEATURES), expected["logits"])
    np.testing.assert_array_equal(region.get(np.float32, [ROWS, 8], FEATURES + SCORES), expected["probabilities"])


def test_shared_memory_grpc_infer_keeps_raw_contents_aligned_when_one_output_in_region(
    gateway: RunningGateway, region: ShmObject
) -> None:
    features = models.mlp_inputs(ROWS, seed=12).numpy()
    region.put(features)
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        client.register_system_shared_memory("scores", region.key, SCORES, offset=FEATURES)
        try:
            tensor = grpcclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES)
            logits = grpcclient.InferRequestedOutput("logits")
            logits.set_shared_memory("scores", SCORES)
            outputs = [logits, grpcclient.InferRequestedOutput("probabilities")]
            result = client.infer("mlp", [tensor], model_version="1", outputs=outputs)
        finally:
            client.unregister_system_shared_memory()
    expected = body_answer(gateway, features)
    response = result.get_response()
    assert list(response.raw_output_contents) == [b"", response.raw_output_contents[1]]  # as Triton answers
    parameters = result.get_output("logits").parameters
    assert parameters["shared_memory_region"].string_param == "scores"
    assert parameters["shared_memory_byte_size"].int64_param == SCORES
    np.testing.assert_array_equal(result.as_numpy("probabilities"), expected["probabilities"])
    np.testing.assert_array_equal(region.get(np.float32, [ROWS, 8], FEATURES), expected["logits"])


async def test_shared_memory_http_aio_infer_matches_body_path_when_input_in_region(
    gateway: RunningGateway, region: ShmObject
) -> None:
    features = models.mlp_inputs(ROWS, seed=13).numpy()
    region.put(features)
    async with httpaio.InferenceServerClient(gateway.http_url) as client:
        await client.unregister_system_shared_memory()  # a client's clean start
        await client.register_system_shared_memory("features", region.key, FEATURES)
        tensor = httpaio.InferInput("features", [ROWS, 32], "FP32")
        tensor.set_shared_memory("features", FEATURES)
        result = await client.infer("mlp", [tensor], model_version="1")
        assert [r["name"] for r in await client.get_system_shared_memory_status()] == ["features"]
        await client.unregister_system_shared_memory("features")
    np.testing.assert_array_equal(result.as_numpy("probabilities"), body_answer(gateway, features)["probabilities"])


async def test_shared_memory_grpc_aio_infer_matches_body_path_when_output_in_region(
    gateway: RunningGateway, region: ShmObject
) -> None:
    features = models.mlp_inputs(ROWS, seed=14).numpy()
    async with grpcaio.InferenceServerClient(gateway.grpc_url) as client:
        await client.unregister_system_shared_memory()
        await client.register_system_shared_memory("probabilities", region.key, SCORES, offset=FEATURES + SCORES)
        tensor = grpcaio.InferInput("features", [ROWS, 32], "FP32")
        tensor.set_data_from_numpy(features)
        wanted = grpcaio.InferRequestedOutput("probabilities")
        wanted.set_shared_memory("probabilities", SCORES)
        await client.infer("mlp", [tensor], model_version="1", outputs=[wanted])
        await client.unregister_system_shared_memory()
    expected = body_answer(gateway, features)["probabilities"]
    np.testing.assert_array_equal(region.get(np.float32, [ROWS, 8], FEATURES + SCORES), expected)


def test_shared_memory_http_infer_answers_400_when_offset_runs_past_region(
    gateway: RunningGateway, region: ShmObject
) -> None:
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        try:
            tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES, offset=FEATURES)
            with pytest.raises(InferenceServerException) as caught:
                client.infer("mlp", [tensor])
        finally:
            client.unregister_system_shared_memory()
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        f"input 'features': offset {FEATURES} + byte_size {FEATURES} runs past the end of shared memory region "
        f"'features' ({FEATURES} bytes)"
    )


def test_shared_memory_grpc_infer_answers_invalid_argument_when_offset_runs_past_region(
    gateway: RunningGateway, region: ShmObject
) -> None:
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        try:
            tensor = grpcclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES, offset=8)
            with pytest.raises(InferenceServerException) as caught:
                client.infer("mlp", [tensor])
        finally:
            client.unregister_system_shared_memory()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "offset 8 + byte_size 384 runs past the end of shared memory region 'features' (384 bytes)" in str(
        caught.value
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_infer_answers_400_when_output_region_too_small(
    gateway: RunningGateway, region: ShmObject, protocol: str
) -> None:
    client_module = httpclient if protocol == "http" else grpcclient
    url = gateway.http_url if protocol == "http" else gateway.grpc_url
    with client_module.InferenceServerClient(url) as client:
        client.register_system_shared_memory("small", region.key, SCORES - 4)
        try:
            tensor = client_module.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_data_from_numpy(models.mlp_inputs(ROWS, seed=15).numpy())
            wanted = client_module.InferRequestedOutput("logits")
            wanted.set_shared_memory("small", SCORES - 4)
            with pytest.raises(InferenceServerException) as caught:
                client.infer("mlp", [tensor], outputs=[wanted])
        finally:
            client.unregister_system_shared_memory()
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert (
        f"output 'logits': shape [{ROWS}, 8] of FP32 needs {SCORES} bytes, more than the {SCORES - 4} bytes "
        "(shared_memory_byte_size) given in shared memory region 'small'"
    ) in str(caught.value)


def test_shared_memory_http_infer_answers_400_when_byte_size_disagrees_with_shape(
    gateway: RunningGateway, region: ShmObject
) -> None:
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        try:
            tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES - 4)
            with pytest.raises(InferenceServerException) as caught:
                client.infer("mlp", [tensor])
        finally:
            client.unregister_system_shared_memory()
    assert caught.value.message() == (
        f"input 'features': shape [{ROWS}, 32] of FP32 needs {FEATURES} bytes, shared_memory_byte_size is "
        f"{FEATURES - 4}"
    )


def test_shared_memory_http_infer_answers_400_when_region_unknown(gateway: RunningGateway) -> None:
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
        tensor.set_shared_memory("nowhere", FEATURES)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("mlp", [tensor])
    assert caught.value.message() == "input 'features': no system shared memory region 'nowhere' is registered"


def test_shared_memory_grpc_infer_carries_exact_strings_when_bytes_tensors_in_regions(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = serialized(TEXT)
    root = string_repository(tmp_path_factory.mktemp("strings"), torchscript=False)
    settings = Settings(repository=root, port=0, grpc_port=0, shared_memory=True)
    with running_gateway(settings) as gateway, shm_object(2 * len(data)) as region:
        region.put(np.frombuffer(data, dtype=np.uint8))
        with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
            client.register_system_shared_memory("text", region.key, len(data))
            client.register_system_shared_memory("echo", region.key, len(data), offset=len(data))
            tensor = grpcclient.InferInput("text", [1, len(TEXT)], "BYTES")
            tensor.set_shared_memory("text", len(data))
            wanted = grpcclient.InferRequestedOutput("echo")
            wanted.set_shared_memory("echo", len(data))
            result = client.infer("echo", [tensor], outputs=[wanted])
            client.unregister_system_shared_memory()
        assert result.get_output("echo").parameters["shared_memory_byte_size"].int64_param == len(data)
        assert bytes(region.get(np.uint8, [len(data)], len(data))) == data
