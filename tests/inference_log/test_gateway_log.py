"""The inference log's folder through a real gateway (embedded onnxruntime, real ports): a folder it cannot write
costs the records, never the serving, and is written once it can be."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from services.gateway.settings import Settings
from tests.bf16_models import ONNX_MODEL, write_onnx_model
from tests.gateway_harness import RunningGateway, running_gateway


def infer(gateway: RunningGateway) -> None:
    tensor = httpclient.InferInput("x", [1, 4], "BF16")
    tensor.set_data_from_numpy(np.array([[0.5, -1.25, 3.0, 2.0]], dtype=ml_dtypes.bfloat16))
    answer = httpclient.InferenceServerClient(gateway.http_url).infer(ONNX_MODEL, [tensor])
    assert answer.as_numpy("f") is not None


def wait_for(gateway: RunningGateway, metric: str, value: float, **labels: str) -> None:
    deadline = time.monotonic() + 30
    while gateway.metric(metric, **labels) < value:
        assert time.monotonic() < deadline, f"{metric}{labels} did not reach {value}"
        time.sleep(0.05)


@pytest.mark.slow  # a gateway on real ports
def test_a_log_folder_the_gateway_cannot_make_is_said_and_the_gateway_serves_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_onnx_model(tmp_path / "repository")
    blocker = tmp_path / "not-a-folder"  # a file where the log's folder should be made (read-only disks alike)
    blocker.write_text("")
    folder = blocker / "log"
    settings = Settings(repository=tmp_path / "repository", port=0, grpc_port=None, inference_log=f"file://{folder}")
    with caplog.at_level(logging.WARNING, logger="services.gateway.inference_log.sinks"), \
            running_gateway(settings) as gateway:
        assert f"cannot write log files in {folder}" in caplog.text
        infer(gateway)  # served
        wait_for(gateway, "switchyard_inference_log_dropped_total", 1, reason="sink_error")
        blocker.unlink()  # the operator fixes the folder: no restart needed
        infer(gateway)
        wait_for(gateway, "switchyard_inference_log_records_total", 1)
    assert len(list(folder.glob("inference-*.jsonl"))) == 1
