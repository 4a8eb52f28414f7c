"""The embedded backend refuses decoupled models (many responses per request): reported unavailable, with why."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.gateway.backends.embedded import DECOUPLED_PROBLEM, EmbeddedBackend
from services.gateway.errors import ModelNotReady
from services.gateway.repository import Catalog
from tests.decoupled_models import MODEL, write_countdown

ONNX_DECOUPLED = """
name: "streamer"
platform: "onnxruntime_onnx"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input { name: "x" data_type: TYPE_FP32 dims: [ 1 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 1 ] }
"""


async def test_embedded_backend_reports_a_model_unavailable_with_the_reason_when_its_config_is_decoupled(
    tmp_path: Path,
) -> None:
    write_countdown(tmp_path)  # a python model: the decoupled reason wins over the platform's
    (tmp_path / "streamer" / "1").mkdir(parents=True)
    (tmp_path / "streamer" / "1" / "model.onnx").write_bytes(b"")  # never opened: refused before loading
    (tmp_path / "streamer" / "config.pbtxt").write_text(ONNX_DECOUPLED)
    catalog = Catalog(tmp_path)
    catalog.scan()
    backend = EmbeddedBackend(catalog)
    await backend.start({name: entry.selected for name, entry in catalog.entries.items()})
    try:
        for model in (MODEL, "streamer"):
            assert backend.problem(model) == DECOUPLED_PROBLEM
            assert backend.models()[model] == {}
            assert not backend.decoupled(model)  # nothing loaded here ever streams
            with pytest.raises(ModelNotReady, match=r"is unavailable: decoupled models \(model_transaction_policy"):
                await backend.load(model, 1)
        assert "serve this repository with --backend triton" in DECOUPLED_PROBLEM
    finally:
        await backend.close()
