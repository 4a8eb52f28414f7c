"""EmbeddedBackend on exported versions: load / unload per version, broken versions, drained unloads."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest

from examples import models
from services.gateway.backends.embedded import EmbeddedBackend
from services.gateway.errors import GatewayError, ModelNotFound
from services.gateway.repository import Catalog
from services.gateway.tensors.types import InferInput, InferRequest, VersionState

pytestmark = pytest.mark.slow  # a gateway on real ports


def _mlp_only(repository: Path, target: Path) -> Path:
    shutil.copytree(repository / "mlp", target / "mlp")
    return target


async def started(root: Path) -> EmbeddedBackend:
    """The backend on its own, loading what the version policies select (the version manager's startup)."""
    catalog = Catalog(root)
    catalog.scan()
    backend = EmbeddedBackend(catalog)
    await backend.start({name: entry.selected for name, entry in catalog.entries.items()})
    return backend


def _request(version: int | None = None) -> InferRequest:
    features = models.mlp_inputs(2, seed=1).numpy()
    return InferRequest("mlp", version, [InferInput("features", "FP32", features.shape, features)])


async def test_embedded_backend_unloads_and_reloads_version_when_asked(repository: Path, tmp_path: Path) -> None:
    backend = await started(_mlp_only(repository, tmp_path))
    try:
        assert backend.models() == {"mlp": {1: VersionState.READY, 2: VersionState.READY}}
        pending = asyncio.create_task(backend.infer(_request(), version=1, timeout_s=None, priority=0))
        await asyncio.sleep(0)  # one loop turn: the request is queued
        await backend.unload("mlp", 1)  # drains the request already queued
        assert (await pending).outputs[0].data.shape == (2, 8)
        assert backend.models()["mlp"] == {2: VersionState.READY}
        with pytest.raises(ModelNotFound, match="Request for unknown model: 'mlp' version 1 is not found"):
            await backend.infer(_request(), version=1, timeout_s=None, priority=0)
        await backend.load("mlp", 1)
        assert await backend.ready("mlp", 1)
        response = await backend.infer(_request(), version=1, timeout_s=None, priority=0)
        assert [o.name for o in response.outputs] == ["logits", "probabilities"]
        np.testing.assert_allclose(response.outputs[1].data.sum(axis=1), 1.0, rtol=1e-5)
    finally:
        await backend.close()


async def test_embedded_backend_keeps_other_versions_serving_when_one_fails_to_load(
    repository: Path, tmp_path: Path
) -> None:
    root = _mlp_only(repository, tmp_path)
    (root / "mlp" / "2" / "model.onnx").write_bytes(b"not an onnx graph")
    backend = await started(root)
    try:
        assert backend.models() == {"mlp": {1: VersionState.READY, 2: VersionState.UNAVAILABLE}}
        with pytest.raises(GatewayError, match="loading model 'mlp' version 2 failed") as caught:
            await backend.load("mlp", 2)
        assert caught.value.status == 503
        assert await backend.ready("mlp", 1)
        with pytest.raises(ModelNotFound, match="'mlp' version 9 is not found; the repository has no version 9"):
            await backend.load("mlp", 9)
    finally:
        await backend.close()
