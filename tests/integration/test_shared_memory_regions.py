"""Registering, listing and unregistering system shared-memory regions with tritonclient (HTTP and gRPC), the CUDA
calls' clear refusal, the limits, the tenants' separate namespaces, and the descriptors closed on unregister and on
shutdown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pydantic import SecretStr
from tritonclient.utils import InferenceServerException

from examples import models
from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.shm_support import ShmObject, descriptors, mappings, shm_object

pytestmark = pytest.mark.slow  # a gateway on real ports

CUDA_REFUSAL = (
    "CUDA shared memory is not supported by this gateway; use system shared memory or send tensors in the request"
)


@pytest.fixture(scope="module")
def shm_gateway(repository: Path) -> Iterator[RunningGateway]:
    settings = Settings(
        repository=repository, port=0, grpc_port=0, shared_memory=True, shared_memory_max_regions=3,
        shared_memory_max_bytes=2048,
    )
    with running_gateway(settings) as running:
        yield running


@pytest.fixture
def region() -> Iterator[ShmObject]:
    with shm_object(1024) as found:
        yield found


def test_shared_memory_cleanup_calls_succeed_when_extension_is_off(gateway: RunningGateway, region: ShmObject) -> None:
    with httpclient.InferenceServerClient(gateway.http_url) as client:
        client.unregister_system_shared_memory()
        client.unregister_cuda_shared_memory()
        assert client.get_system_shared_memory_status() == []
        assert client.get_cuda_shared_memory_status() == []
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("r", region.key, 64)
    assert caught.value.status() == "400"
    assert "SWITCHYARD_SHARED_MEMORY=true" in caught.value.message()
    with grpcclient.InferenceServerClient(gateway.grpc_url) as grpc:
        grpc.unregister_system_shared_memory()
        grpc.unregister_cuda_shared_memory()
        assert not grpc.get_system_shared_memory_status().regions


def test_shared_memory_status_lists_regions_when_registered(shm_gateway: RunningGateway, region: ShmObject) -> None:
    with httpclient.InferenceServerClient(shm_gateway.http_url) as client:
        assert "system_shared_memory" in client.get_server_metadata()["extensions"]
        client.register_system_shared_memory("a", region.key, 256)
        client.register_system_shared_memory("b", region.key, 512, offset=256)
        try:
            assert client.get_system_shared_memory_status() == [
                {"name": "a", "key": region.key, "offset": 0, "byte_size": 256},
                {"name": "b", "key": region.key, "offset": 256, "byte_size": 512},
            ]
            assert client.get_system_shared_memory_status("b") == [
                {"name": "b", "key": region.key, "offset": 256, "byte_size": 512}
            ]
            with pytest.raises(InferenceServerException) as caught:
                client.get_system_shared_memory_status("c")
            assert caught.value.status() == "404"
            with grpcclient.InferenceServerClient(shm_gateway.grpc_url) as grpc:
                regions = grpc.get_system_shared_memory_status(as_json=True)["regions"]
                assert regions["b"] == {"name": "b", "key": region.key, "offset": "256", "byte_size": "512"}
                assert set(regions) == {"a", "b"}
                grpc.unregister_system_shared_memory("a")
                with pytest.raises(InferenceServerException) as missing:
                    grpc.get_system_shared_memory_status("a")
                assert missing.value.status() == "StatusCode.NOT_FOUND"
            client.unregister_system_shared_memory("a")  # unknown now: no error, as in Triton
            assert [r["name"] for r in client.get_system_shared_memory_status()] == ["b"]
        finally:
            client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_register_answers_400_when_name_registered_twice(
    shm_gateway: RunningGateway, region: ShmObject, protocol: str
) -> None:
    client_module = httpclient if protocol == "http" else grpcclient
    url = shm_gateway.http_url if protocol == "http" else shm_gateway.grpc_url
    with client_module.InferenceServerClient(url) as client:
        client.register_system_shared_memory("twice", region.key, 64)
        try:
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("twice", region.key, 64, offset=64)
        finally:
            client.unregister_system_shared_memory()
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert "shared memory region 'twice' already in manager" in str(caught.value)


@pytest.mark.parametrize(
    ("key", "offset", "byte_size", "message"),
    [
        ("/../etc/passwd", 0, 8, "is not a shm object name"),
        ("/a/b", 0, 8, "is not a shm object name"),
        ("..", 0, 8, "is not a shm object name"),
        ("/x\x00y", 0, 8, "is not a shm object name"),
        ("/switchyard-test-missing", 0, 8, "no shm object '/switchyard-test-missing' exists on the gateway's host"),
        (None, 1000, 100, "has 1024 bytes; offset 1000 + byte_size 100 runs past its end"),
        (None, 0, 0, "byte_size must be at least 1"),
    ],
)
def test_shared_memory_register_answers_400_when_key_or_window_is_wrong(
    shm_gateway: RunningGateway, region: ShmObject, key: str | None, offset: int, byte_size: int, message: str
) -> None:
    with httpclient.InferenceServerClient(shm_gateway.http_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("bad", key or region.key, byte_size, offset=offset)
        assert client.get_system_shared_memory_status() == []
    assert caught.value.status() == "400"
    assert message in caught.value.message()


def test_shared_memory_register_answers_400_when_limits_reached(shm_gateway: RunningGateway, region: ShmObject) -> None:
    with httpclient.InferenceServerClient(shm_gateway.http_url) as client:
        try:
            client.register_system_shared_memory("big", region.key, 1024)
            client.register_system_shared_memory("bigger", region.key, 1024)
            with pytest.raises(InferenceServerException) as too_big:
                client.register_system_shared_memory("too much", region.key, 8)
            assert too_big.value.message() == (
                "registering 'too much' (8 bytes) would register 2056 bytes in all, above the gateway's limit of 2048 "
                "(SWITCHYARD_SHARED_MEMORY_MAX_BYTES)"
            )
            client.unregister_system_shared_memory("big")
            client.register_system_shared_memory("small", region.key, 8)
            client.register_system_shared_memory("smaller", region.key, 4)
            with pytest.raises(InferenceServerException) as too_many:
                client.register_system_shared_memory("one more", region.key, 8)
            assert "holds 3 shared memory regions, its limit" in too_many.value.message()
        finally:
            client.unregister_system_shared_memory()


def test_shared_memory_cuda_calls_answer_clear_refusal_when_registering(shm_gateway: RunningGateway) -> None:
    with httpclient.InferenceServerClient(shm_gateway.http_url) as client:
        with pytest.raises(InferenceServerException) as http_error:
            client.register_cuda_shared_memory("gpu", "AAAA", 0, 64)
        assert client.get_cuda_shared_memory_status() == []
        client.unregister_cuda_shared_memory()
        client.unregister_cuda_shared_memory("gpu")
    assert (http_error.value.status(), http_error.value.message()) == ("400", CUDA_REFUSAL)
    with grpcclient.InferenceServerClient(shm_gateway.grpc_url) as grpc:
        with pytest.raises(InferenceServerException) as grpc_error:
            grpc.register_cuda_shared_memory("gpu", b"AAAA", 0, 64)
        with pytest.raises(InferenceServerException) as named:
            grpc.get_cuda_shared_memory_status("gpu")
        assert not grpc.get_cuda_shared_memory_status().regions
        grpc.unregister_cuda_shared_memory()
    assert grpc_error.value.status() == named.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert grpc_error.value.message() == CUDA_REFUSAL


def test_shared_memory_tenants_see_only_their_regions_when_api_keys_on(repository: Path, region: ShmObject) -> None:
    keys = SecretStr("k-alice-0123:alice,k-bob-4567:bob")
    settings = Settings(repository=repository, port=0, grpc_port=0, shared_memory=True, api_keys=keys)
    with running_gateway(settings) as gateway:
        alice = httpclient.InferenceServerClient(gateway.http_url)
        bob = grpcclient.InferenceServerClient(gateway.grpc_url)
        try:
            with pytest.raises(InferenceServerException) as anonymous:
                alice.get_system_shared_memory_status()
            assert anonymous.value.status() == "401"
            alice.register_system_shared_memory("r", region.key, 512, headers={"X-API-Key": "k-alice-0123"})
            bob_key = {"x-api-key": "k-bob-4567"}
            assert not bob.get_system_shared_memory_status(headers=bob_key).regions
            bob.register_system_shared_memory("r", region.key, 128, offset=512, headers=bob_key)
            bob.unregister_system_shared_memory(headers=bob_key)
            listed = alice.get_system_shared_memory_status(headers={"X-API-Key": "k-alice-0123"})
            assert listed == [{"name": "r", "key": region.key, "offset": 0, "byte_size": 512}]
            tensor = grpcclient.InferInput("features", [1, 32], "FP32")
            tensor.set_shared_memory("r", 128)
            with pytest.raises(InferenceServerException) as foreign:
                bob.infer("mlp", [tensor], headers=bob_key)
            assert "no system shared memory region 'r' is registered" in foreign.value.message()
        finally:
            alice.close()
            bob.close()


def test_shared_memory_regions_close_when_unregistered_and_on_shutdown(repository: Path) -> None:
    features = models.mlp_inputs(2, seed=5).numpy()
    with shm_object(2 * 32 * 4 + 2 * 8 * 4) as region:
        region.put(features)
        alone = descriptors(region.path)  # the client's own descriptor
        mapped = mappings(region.path)  # and mapping
        settings = Settings(repository=repository, port=0, grpc_port=0, shared_memory=True)
        with running_gateway(settings) as gateway, httpclient.InferenceServerClient(gateway.http_url) as client:
            client.register_system_shared_memory("in", region.key, 256)
            client.register_system_shared_memory("out", region.key, 64, offset=256)
            assert descriptors(region.path) == alone + 2
            assert mappings(region.path) == mapped  # the gateway never maps a client's object
            tensor = httpclient.InferInput("features", [2, 32], "FP32")
            tensor.set_shared_memory("in", 256)
            wanted = httpclient.InferRequestedOutput("probabilities")
            wanted.set_shared_memory("out", 64)
            client.infer("mlp", [tensor], outputs=[wanted])
            client.unregister_system_shared_memory("out")
            assert descriptors(region.path) == alone + 1
            client.infer("mlp", [tensor])  # the input region again
            client.register_system_shared_memory("out", region.key, 64, offset=256)
            assert descriptors(region.path) == alone + 2
        assert descriptors(region.path) == alone
        assert np.isfinite(region.get(np.float32, [2, 8], 256)).all()
