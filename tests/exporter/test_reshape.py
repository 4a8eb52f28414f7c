"""A tensor of shape (batch,) is served as Triton serves a scalar per row: ``dims: [1]`` with ``reshape { shape: []
}``; clients send and get (batch, 1), the model sees (batch,). The embedded backend honours the reshape."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

from exporter import export
from exporter.model_config import read_config
from services.gateway.backends.embedded import EmbeddedBackend
from services.gateway.repository import Catalog
from services.gateway.versions.warmup import run_request, warm_up

pytestmark = pytest.mark.slow  # exports a model


class Scored(NamedTuple):
    scores: torch.Tensor
    label: torch.Tensor


class Weighted(nn.Module):
    """A per-row weight in, a per-row label out: both (batch,)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> Scored:
        y = self.fc(x) * w.unsqueeze(1)
        return Scored(y, y.argmax(-1))


async def test_embedded_backend_serves_per_row_scalars_when_export_declares_them_with_reshape(repo: Path) -> None:
    torch.manual_seed(0)
    model = Weighted().eval()
    export(model, (torch.randn(2, 4), torch.rand(2) + 0.5), name="weighted", repository=repo, max_batch_size=8)

    config = read_config(repo / "weighted")
    shaped = {t.name: (list(t.dims), t.HasField("reshape"), list(t.reshape.shape))
              for t in (*config.input, *config.output)}
    assert shaped == {"x": ([4], False, []), "w": ([1], True, []), "output__scores": ([3], False, []),
                      "output__label": ([1], True, [])}
    assert list(config.model_warmup[0].inputs["w"].dims) == [1]

    catalog = Catalog(repo)
    catalog.scan()
    backend = EmbeddedBackend(catalog)
    await backend.start({name: entry.selected for name, entry in catalog.entries.items()})
    try:
        warmed = await warm_up(backend, catalog.entries["weighted"], 1, timeout_s=30)  # the samples, (batch, 1)
        assert warmed.failed == ()
        x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
        w = np.array([[1.0], [-1.0], [2.0]], np.float32)
        metadata = await backend.metadata("weighted", 1)
        answer = await run_request(backend, metadata, "weighted", 1, {"x": x, "w": w}, "test", 30)
    finally:
        await backend.close()

    with torch.no_grad():
        expected = model(torch.from_numpy(x), torch.from_numpy(w[:, 0]))
    assert answer["output__label"].shape == (3, 1)
    np.testing.assert_array_equal(answer["output__label"][:, 0], expected.label.numpy())
    np.testing.assert_allclose(answer["output__scores"], expected.scores.numpy(), atol=1e-5)
