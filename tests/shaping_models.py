"""Models for request-shaping tests: ``heavy`` (a wide MLP whose time grows with the rows sent, so a test can make
a request as slow as it needs) and ``faulty`` (fails at run time for a batch of one: a real model error, a 500)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import nn

from exporter import export

HEAVY_FEATURES = 1024
HEAVY_MAX_BATCH = 256

BUSY_FEATURES = 256
BUSY_CONFIG = """
name: "busy"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 256 ] }
input { name: "iterations" data_type: TYPE_INT64 dims: [ 1 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 256 ] }
instance_group { count: 1 kind: KIND_CPU }
"""

FAULTY_CONFIG = """
name: "faulty"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
"""


def shaping_repository(root: Path) -> Path:
    torch.manual_seed(7)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(HEAVY_FEATURES, HEAVY_FEATURES), nn.ReLU()]
    heavy = nn.Sequential(*layers).eval()
    example = torch.randn(2, HEAVY_FEATURES)
    # No batch merging and one instance: a request's time is its own rows' time, the model sustains one at a time.
    export(
        heavy, example, name="heavy", repository=root, max_batch_size=HEAVY_MAX_BATCH, instances=1, max_queue_delay_us=0
    )
    _write_faulty(root / "faulty")
    _write_busy(root / "busy")
    return root


def heavy_rows(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, HEAVY_FEATURES)).astype(np.float32)


def busy_inputs(iterations: int, rows: int = 1) -> dict[str, np.ndarray]:
    x = np.random.default_rng(rows).standard_normal((rows, BUSY_FEATURES)).astype(np.float32)
    return {"x": x, "iterations": np.full((rows, 1), iterations, dtype=np.int64)}


def _write_busy(folder: Path) -> None:
    """y = tanh(x @ W) applied ``max(iterations)`` times: a request chooses how long the model works (about 10 µs
    per iteration and row here) while its body stays 1 KB, so a load test can saturate the model, not the wire."""
    (folder / "1").mkdir(parents=True)
    weight = np.random.default_rng(3).standard_normal((BUSY_FEATURES, BUSY_FEATURES)).astype(np.float32) / 16
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x_in", "weight"], ["product"]),
            helper.make_node("Tanh", ["product"], ["x_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "step",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, ["n", BUSY_FEATURES]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["n", BUSY_FEATURES]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["iterations"], ["trips"], keepdims=0),
            helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body),
        ],
        "busy",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", BUSY_FEATURES]),
            helper.make_tensor_value_info("iterations", TensorProto.INT64, ["n", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", BUSY_FEATURES])],
        initializer=[
            helper.make_tensor("weight", TensorProto.FLOAT, list(weight.shape), weight.ravel().tolist()),
            helper.make_tensor("keep_going", TensorProto.BOOL, [], [True]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(BUSY_CONFIG)


def _write_faulty(folder: Path) -> None:
    """y = x, through a reshape to [max(x), -1] and back: onnxruntime fails when the largest value does not divide
    the element count (one row holding a 3), and answers otherwise (zeros too: a 0 keeps the first dim)."""
    (folder / "1").mkdir(parents=True)
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["largest"], keepdims=0),
        helper.make_node("Cast", ["largest"], ["rows"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"]),
        helper.make_node("Concat", ["rows1", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["t"]),
        helper.make_node("Reshape", ["t", "back"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "faulty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        initializer=[
            helper.make_tensor("axis0", TensorProto.INT64, [1], [0]),
            helper.make_tensor("rest", TensorProto.INT64, [1], [-1]),
            helper.make_tensor("back", TensorProto.INT64, [2], [-1, 4]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(FAULTY_CONFIG)


def faulty_repository(root: Path) -> Path:
    """A repository holding ``faulty`` alone: a real ONNX model, no export needed."""
    _write_faulty(root / "faulty")
    return root
