"""The model cache's memory against what the process really holds, on the embedded backend (real onnxruntime
sessions): models of 8 MiB of weights each, written by hand, round-robin through a budget that holds a few. A
model that fits is never measured as larger than the budget: memory an unloaded model left to the garbage
collector or the allocator is no model's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow

WIDTH = 1448
"""A WIDTH x WIDTH FP32 weight: 8 MiB."""
MODELS = [f"m{number}" for number in range(8)]
BUDGET_MB = 40


def body(width: int) -> dict[str, object]:
    return {"inputs": [{"name": "x", "shape": [1, width], "datatype": "FP32", "data": [0.25] * width}]}


def matmul_model(root: Path, name: str, seed: int, width: int = WIDTH) -> None:
    """``y = x @ W``, version 1, as another tool would write it (no manifest, no warm-up, nothing declared)."""
    weight = np.random.default_rng(seed).standard_normal((width, width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, width])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True)
    onnx.save(model, str(root / name / "1" / "model.onnx"))
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input {{ name: "x" data_type: TYPE_FP32 dims: [ {width} ] }}\n'
        f'output {{ name: "y" data_type: TYPE_FP32 dims: [ {width} ] }}\n'
    )


@pytest.fixture
def cached(tmp_path: Path) -> Iterator[RunningGateway]:
    root = tmp_path / "repository"
    for seed, name in enumerate(MODELS):
        matmul_model(root, name, seed)
    settings = Settings(repository=root, port=0, grpc_port=0, repository_poll_s=0, model_cache_mb=BUDGET_MB)
    with running_gateway(settings) as running:
        yield running


def test_models_that_fit_are_served_round_robin_and_never_refused_as_larger_than_the_budget(
    cached: RunningGateway,
) -> None:
    cache = cached.app.state.dataplane.cache
    answers: list[tuple[str, int, str]] = []
    with httpx.Client(base_url=f"http://{cached.http_url}", timeout=60) as http:
        for _ in range(2):  # loaded, unloaded to make room, loaded again
            for model in MODELS:
                answer = http.post(f"/v2/models/{model}/infer", json=body(WIDTH))
                answers.append((model, answer.status_code, answer.text[:200] if answer.status_code != 200 else ""))

    assert [answer for answer in answers if answer[1] != 200] == []
    assert cache.used_mb <= BUDGET_MB
    assert cached.metric("switchyard_model_cache_evictions_total", reason="capacity") >= len(MODELS)
