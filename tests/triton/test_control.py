"""TritonBackend's model control against its own Triton: it loads what the policies select into an empty
explicit-mode server, and loads / unloads specific versions with a complete config override (over gRPC)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from services.gateway.errors import BackendUnavailable, GatewayError, ModelNotFound, ModelNotReady
from services.gateway.settings import Settings
from services.gateway.tensors.types import InferInput, InferRequest, VersionState
from services.tritonlocal import TritonInstall
from tests.gateway_harness import Reference
from tests.triton.support import local_triton, started_backend
from tests.tritonlocal.support import sample

pytestmark = pytest.mark.slow  # a local Triton

READY = VersionState.READY


async def test_backend_loads_and_unloads_specific_versions_when_asked(
    install: TritonInstall, repository: Path, reference: Reference, tmp_path: Path
) -> None:
    with local_triton(repository, tmp_path, install) as server:
        assert server.model_states("mlp") == {}  # explicit mode: nothing loaded yet
        backend = await started_backend(repository, Settings(triton_url=server.grpc_url))
        try:
            assert backend.models() == {"classifier": {1: READY, 2: READY}, "mlp": {1: READY, 2: READY}}
            assert server.model_states("mlp") == {1: "READY", 2: "READY"}

            await backend.unload("mlp", 1)
            assert server.model_states("mlp") == {1: "UNAVAILABLE", 2: "READY"}  # settled, not UNLOADING
            assert backend.models()["mlp"] == {2: READY}
            assert not await backend.ready("mlp", 1)
            with pytest.raises(ModelNotFound):
                await backend.unload("mlp", 1)

            await backend.load("mlp", 1)
            assert server.model_states("mlp") == {1: "READY", 2: "READY"}
            features = sample("mlp", rows=4, seed=2)["features"]
            request = InferRequest("mlp", 1, [InferInput("features", "FP32", features.shape, features)], id="r1")
            response = await backend.infer(request, version=1, timeout_s=5.0, priority=0)
            assert (response.version, response.id) == (1, "r1")
            got = {o.name: o.data for o in response.outputs}
            for name, want in reference("mlp", 1, {"features": features}).items():
                np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)

            with pytest.raises(ModelNotFound, match="no version 7"):
                await backend.load("mlp", 7)
            with pytest.raises(ModelNotFound, match="unknown model"):
                await backend.load("nope", 1)
            config = await backend.config("classifier", 2)
            assert config.backend == "python"  # the local CPU twin of the exporter's onnxruntime config
            assert list(config.version_policy.specific.versions) == [1, 2]
        finally:
            await backend.close()


async def wait_for(condition: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_backend_connects_and_loads_by_itself_when_triton_starts_after_it(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    server = local_triton(repository, tmp_path, install)  # ports picked, not started yet
    settings = Settings(triton_url=server.grpc_url, triton_probe_interval_s=0.1, triton_reload_interval_s=0.5)
    backend = await started_backend(repository, settings)
    try:
        assert not await backend.live()
        assert backend.models()["mlp"] == {1: VersionState.UNAVAILABLE, 2: VersionState.UNAVAILABLE}
        features = sample("mlp", rows=1)["features"]
        request = InferRequest("mlp", 2, [InferInput("features", "FP32", features.shape, features)])
        with pytest.raises(BackendUnavailable) as caught:
            await backend.infer(request, version=2, timeout_s=1.0, priority=0)
        assert caught.value.status == 503
        assert caught.value.retry_after_s is not None

        with server:
            await wait_for(lambda: backend.models()["mlp"] == {1: READY, 2: READY}, 10.0)
            assert await backend.live()
            assert (await backend.infer(request, version=2, timeout_s=1.0, priority=0)).version == 2

            # Someone unloads the model behind the gateway's back: the request is refused as not ready /
            # not found, and the backend loads its wanted versions again by itself.
            server.unload("mlp")
            with pytest.raises((ModelNotReady, ModelNotFound)):
                await backend.infer(request, version=2, timeout_s=1.0, priority=0)
            await wait_for(lambda: server.model_states("mlp") == {1: "READY", 2: "READY"}, 5.0)
    finally:
        await backend.close()


async def test_a_failed_load_leaves_no_version_shown_loading(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    """The health probe reads Triton's index while a load runs and sees the new version LOADING; when the load fails
    that view must not stand until the probe's next look (an admin call answered 422 and the version still shown
    loading beside it)."""
    source = tmp_path / "repository"
    shutil.copytree(repository / "mlp", source / "mlp")
    with local_triton(source, tmp_path, install) as server:
        # A probe every 0.2 s looks at least once while the load below runs (a python stub starting: longer).
        backend = await started_backend(source, Settings(triton_url=server.grpc_url, triton_probe_interval_s=0.2))
        try:
            shutil.copytree(source / "mlp" / "2", source / "mlp" / "3")
            (source / "mlp" / "3" / "model.onnx").write_bytes(b"\x08\x07 not an onnx graph")
            server.build()  # the derived repository gets version 3, as `switchyard triton`'s follower does
            with pytest.raises(GatewayError, match="version 3"):
                await backend.load("mlp", 3)
            # No await between the failure and this look: what the backend shows is what the failed load left.
            assert backend.models()["mlp"].get(3) is not VersionState.LOADING
            assert backend.models()["mlp"] == {1: READY, 2: READY}
            assert backend.problem("mlp", 3) is not None
        finally:
            await backend.close()
