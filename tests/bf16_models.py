"""Tiny BF16 models for the gateway's bfloat16 tests, written as the exporter publishes such interfaces
(``TYPE_BF16`` in config.pbtxt): ``x`` BF16 [4] (batched, up to 8 rows) -> ``y`` BF16 = bf16(2·x + 1) and ``f`` FP32
= 2·x + 1. 2·x + 1 is exact in float32 for every bfloat16 ``x``, so the only rounding is the cast back to bfloat16
(to nearest, ties to even, in onnxruntime, torch and ml_dtypes alike): ``expected`` is the eager answer.

``write_onnx_model`` builds the ONNX graph by hand (onnx.helper: Cast, Mul, Add, Cast), with a ``model_warmup`` that
reads a file of raw 2-byte bf16 elements; ``write_torchscript_model`` scripts a torch module (slow: torch.jit)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper

from services.modelrepo import layout

BF16 = np.dtype(ml_dtypes.bfloat16)
ONNX_MODEL = "bf16_onnx"
TORCHSCRIPT_MODEL = "bf16_torchscript"
ELEMENTS = 4
WARMUP_ROWS = np.array([[0.5, -1.25, 3.0, 1e30], [0.1, 2.0**-20, -7.5, 100.0]], dtype=np.float32).astype(BF16)
"""The ``model_warmup`` file's two rows (raw bfloat16 elements, little-endian)."""

_CONFIG = """
name: "{name}"
platform: "{platform}"
max_batch_size: 8
input {{ name: "x" data_type: TYPE_BF16 dims: [ {elements} ] }}
output {{ name: "y" data_type: TYPE_BF16 dims: [ {elements} ] }}
output {{ name: "f" data_type: TYPE_FP32 dims: [ {elements} ] }}
dynamic_batching {{ max_queue_delay_microseconds: 50000 }}
model_warmup {{
  name: "bits" batch_size: 2
  inputs {{ key: "x" value: {{ data_type: TYPE_BF16 dims: [ {elements} ] input_data_file: "x.bin" }} }}
}}
"""


def expected(x: npt.NDArray[np.generic]) -> tuple[npt.NDArray[np.generic], npt.NDArray[np.float32]]:
    """``y`` and ``f`` for bfloat16 ``x``, computed eagerly in numpy."""
    with np.errstate(over="ignore"):  # a value past half of float32's range doubles to inf, as in the models
        f = x.astype(np.float32) * np.float32(2) + np.float32(1)
    return f.astype(BF16), f


def _config(folder: Path, name: str, platform: str) -> None:
    folder.mkdir(parents=True)
    (folder / layout.CONFIG_FILE).write_text(_CONFIG.format(name=name, platform=platform, elements=ELEMENTS))
    (folder / layout.WARMUP_DIR).mkdir()
    # One row: Triton's model_warmup sends the file's row batch_size times.
    (folder / layout.WARMUP_DIR / "x.bin").write_bytes(WARMUP_ROWS[0].view("<u2").tobytes())
    (folder / "1").mkdir()


def write_onnx_model(root: Path) -> Path:
    """``bf16_onnx`` version 1 under ``root``; the model's folder."""
    folder = root / ONNX_MODEL
    _config(folder, ONNX_MODEL, layout.ONNX_PLATFORM)
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    nodes = [
        helper.make_node("Cast", ["x"], ["wide"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["wide", "two"], ["doubled"]),
        helper.make_node("Add", ["doubled", "one"], ["f"]),
        helper.make_node("Cast", ["f"], ["y"], to=TensorProto.BFLOAT16),
    ]
    shape: list[str | int] = ["batch", ELEMENTS]
    graph = helper.make_graph(
        nodes,
        ONNX_MODEL,
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, shape)],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, shape),
         helper.make_tensor_value_info("f", TensorProto.FLOAT, shape)],
        initializer=[two, one],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # what the onnxruntime in the venv reads
    onnx.save(model, str(folder / "1" / "model.onnx"))
    return folder


def write_torchscript_model(root: Path) -> Path:
    """``bf16_torchscript`` version 1 under ``root`` (scripts a module: slow work); the model's folder."""
    import torch

    class Affine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            f = x.float() * 2 + 1
            return f.to(torch.bfloat16), f

    folder = root / TORCHSCRIPT_MODEL
    _config(folder, TORCHSCRIPT_MODEL, layout.TORCHSCRIPT_PLATFORM)
    torch.jit.script(Affine()).save(str(folder / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    return folder
