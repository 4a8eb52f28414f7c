"""System shared memory through the gateway to the real local Triton, which runs on this host: with the gateway
copying tensors between the regions and its requests, and with the regions registered in Triton too
(``triton_shared_memory``), where requests name them and Triton reads and writes them itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from services.tritonlocal import LocalTriton
from tests.gateway_harness import Reference, RunningGateway
from tests.shm_support import ShmObject, shm_object
from tests.triton.support import gateway_settings, local_gateway
from tests.tritonlocal.support import sample

pytestmark = pytest.mark.slow  # a local Triton

ROWS = 2
FEATURES = ROWS * 32 * 4
SCORES = ROWS * 8 * 4


@pytest.fixture(scope="module", params=["copied", "forwarded"])
def shm_gateway(request: pytest.FixtureRequest, triton: LocalTriton, repository: Path) -> Iterator[RunningGateway]:
    forwarded = request.param == "forwarded"
    settings = gateway_settings(triton.grpc_url, repository, shared_memory=True, triton_shared_memory=forwarded)
    with local_gateway(settings) as running:
        yield running


@pytest.fixture
def region() -> Iterator[ShmObject]:
    with shm_object(FEATURES + 2 * SCORES) as found:
        yield found


def triton_regions(triton: LocalTriton, key: str) -> list[str]:
    """Names Triton itself has registered for ``key``."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        regions = client.get_system_shared_memory_status(as_json=True).get("regions", {})
    return sorted(name for name, status in regions.items() if status["key"] == key)


def test_triton_shared_memory_http_infer_matches_reference_when_tensors_in_regions(
    shm_gateway: RunningGateway, triton: LocalTriton, reference: Reference, region: ShmObject
) -> None:
    features = sample("mlp", rows=ROWS, seed=31)["features"]
    region.put(features)
    regions = shm_gateway.app.state.dataplane.regions
    forwarded = shm_gateway.app.state.dataplane.backend.shared_memory is not None
    with httpclient.InferenceServerClient(shm_gateway.http_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        client.register_system_shared_memory("scores", region.key, 2 * SCORES, offset=FEATURES)
        try:
            # Triton maps the shm object once, whole; requests name it with the regions' offsets added
            assert len(triton_regions(triton, region.key)) == (1 if forwarded else 0)
            remote = regions.find("anonymous", "scores").remote_name
            assert (remote is not None) == forwarded
            tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES)
            logits = httpclient.InferRequestedOutput("logits")
            logits.set_shared_memory("scores", SCORES)
            probabilities = httpclient.InferRequestedOutput("probabilities")
            probabilities.set_shared_memory("scores", SCORES, offset=SCORES)
            result = client.infer("mlp", [tensor], model_version="2", outputs=[logits, probabilities])
        finally:
            client.unregister_system_shared_memory()
    assert triton_regions(triton, region.key) == []
    expected = reference("mlp", 2, {"features": features})
    assert result.get_output("probabilities")["parameters"] == {
        "shared_memory_region": "scores", "shared_memory_offset": SCORES, "shared_memory_byte_size": SCORES
    }
    got = {"logits": FEATURES, "probabilities": FEATURES + SCORES}
    for name, offset in got.items():
        np.testing.assert_allclose(region.get(np.float32, [ROWS, 8], offset), expected[name], rtol=1e-5, atol=1e-6)


def test_triton_shared_memory_grpc_infer_matches_body_path_when_one_output_in_region(
    shm_gateway: RunningGateway, region: ShmObject
) -> None:
    features = sample("mlp", rows=ROWS, seed=32)["features"]
    region.put(features)
    with grpcclient.InferenceServerClient(shm_gateway.grpc_url) as client:
        body = grpcclient.InferInput("features", [ROWS, 32], "FP32")
        body.set_data_from_numpy(features)
        expected = client.infer("mlp", [body], model_version="1")
        client.register_system_shared_memory("features", region.key, FEATURES)
        client.register_system_shared_memory("logits", region.key, SCORES, offset=FEATURES)
        try:
            tensor = grpcclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES)
            logits = grpcclient.InferRequestedOutput("logits")
            logits.set_shared_memory("logits", SCORES)
            outputs = [logits, grpcclient.InferRequestedOutput("probabilities")]
            result = client.infer("mlp", [tensor], model_version="1", outputs=outputs)
        finally:
            client.unregister_system_shared_memory()
    assert result.get_response().raw_output_contents[0] == b""
    np.testing.assert_array_equal(result.as_numpy("probabilities"), expected.as_numpy("probabilities"))
    np.testing.assert_array_equal(region.get(np.float32, [ROWS, 8], FEATURES), expected.as_numpy("logits"))


async def test_triton_shared_memory_grpc_aio_answers_invalid_argument_when_offset_runs_past_region(
    shm_gateway: RunningGateway, region: ShmObject
) -> None:
    async with grpcaio.InferenceServerClient(shm_gateway.grpc_url) as client:
        await client.unregister_system_shared_memory()
        await client.register_system_shared_memory("features", region.key, FEATURES)
        try:
            tensor = grpcaio.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES, offset=FEATURES)
            with pytest.raises(InferenceServerException) as caught:
                await client.infer("mlp", [tensor])
        finally:
            await client.unregister_system_shared_memory()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "runs past the end of shared memory region 'features'" in caught.value.message()


def test_triton_shared_memory_http_infer_answers_400_when_output_region_too_small(
    shm_gateway: RunningGateway, region: ShmObject
) -> None:
    with httpclient.InferenceServerClient(shm_gateway.http_url) as client:
        client.register_system_shared_memory("small", region.key, 16)
        try:
            tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_data_from_numpy(sample("mlp", rows=ROWS, seed=33)["features"])
            wanted = httpclient.InferRequestedOutput("logits")
            wanted.set_shared_memory("small", 16)
            with pytest.raises(InferenceServerException) as caught:
                client.infer("mlp", [tensor], outputs=[wanted])
        finally:
            client.unregister_system_shared_memory()
    assert caught.value.status() == "400"
    assert f"needs {SCORES} bytes, more than the 16 bytes" in caught.value.message()


def test_triton_shared_memory_registers_again_when_triton_lost_the_region(
    triton: LocalTriton, repository: Path, region: ShmObject
) -> None:
    features = sample("mlp", rows=ROWS, seed=34)["features"]
    region.put(features)
    settings = gateway_settings(triton.grpc_url, repository, shared_memory=True, triton_shared_memory=True)
    with local_gateway(settings) as gateway, grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        [remote] = triton_regions(triton, region.key)
        with grpcclient.InferenceServerClient(triton.grpc_url) as direct:
            direct.unregister_system_shared_memory(remote)  # what a Triton restart does to every region
        tensor = grpcclient.InferInput("features", [ROWS, 32], "FP32")
        tensor.set_shared_memory("features", FEATURES)
        result = client.infer("mlp", [tensor], model_version="1")
        assert triton_regions(triton, region.key) == [remote]
        assert result.as_numpy("logits").shape == (ROWS, 8)
    assert triton_regions(triton, region.key) == []  # the gateway's shutdown unregistered it in Triton too


def test_triton_shared_memory_answers_each_output_once_when_named_three_times_into_a_region(
    shm_gateway: RunningGateway, region: ShmObject
) -> None:
    """Issue #28, finding 6, where the request Triton gets names the outputs itself (``forwarded``): once each."""
    region.put(sample("mlp", rows=ROWS, seed=32)["features"])
    with httpclient.InferenceServerClient(shm_gateway.http_url) as client:
        client.register_system_shared_memory("features", region.key, FEATURES)
        client.register_system_shared_memory("scores", region.key, 2 * SCORES, offset=FEATURES)
        try:
            tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
            tensor.set_shared_memory("features", FEATURES)
            outputs = [httpclient.InferRequestedOutput("probabilities") for _ in range(3)]
            for output in outputs:
                output.set_shared_memory("scores", SCORES, offset=SCORES)
            result = client.infer("mlp", [tensor], model_version="2", outputs=outputs)
        finally:
            client.unregister_system_shared_memory()
    assert [output["name"] for output in result.get_response()["outputs"]] == ["probabilities"]
