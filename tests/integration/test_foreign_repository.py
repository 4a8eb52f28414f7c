"""The embedded backend serves a Triton repository the exporter did not write: no manifests, a model whose
config and ONNX graph were written by hand, and a TensorRT model it reports unavailable with the reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.gateway.settings import Settings
from tests.foreign_repository import check_engine_unavailable, check_every_model_serves, make_foreign_repository
from tests.gateway_harness import running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports


def test_embedded_backend_serves_every_model_and_reports_the_engine_when_the_repository_is_foreign(
    repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    foreign = make_foreign_repository(repository, tmp_path / "foreign")
    with caplog.at_level(logging.INFO), running_gateway(Settings(repository=foreign, port=0, grpc_port=0)) as gateway:
        check_every_model_serves(gateway, foreign)
        check_engine_unavailable(gateway, "cannot run in the embedded backend", "tensorrt_plan", "--backend triton")
    messages = [record.getMessage() for record in caplog.records]
    # One line per version says what it was warmed with: the config's model_warmup, since no manifest is left.
    assert "warmed model 'addsub' version 3 with model_warmup 'hand_written' (batch 2)" in messages
    assert "warmed model 'mlp' version 2 with model_warmup 'sample_request' (batch 1)" in messages
    assert not any("version 1" in m and "'addsub'" in m for m in messages)  # the default policy serves the latest
    assert any("model 'engine' is unavailable" in m for m in messages)


def test_embedded_backend_warms_with_zeros_when_a_version_has_neither_manifest_nor_model_warmup(
    repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    foreign = make_foreign_repository(repository, tmp_path / "foreign")
    config = foreign / "addsub" / "config.pbtxt"
    config.write_text(config.read_text().split("model_warmup")[0])
    with caplog.at_level(logging.INFO), running_gateway(Settings(repository=foreign, port=0, grpc_port=0)) as gateway:
        check_every_model_serves(gateway, foreign)
    assert "warmed model 'addsub' version 3 with zero-filled inputs (no manifest, no model_warmup)" in [
        record.getMessage() for record in caplog.records
    ]
