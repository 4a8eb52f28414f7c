"""Triton's example models, as its example clients (tritonclient's ``src/python/examples``) expect them:

- ``simple``: INPUT0, INPUT1 INT32 [16] -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, batching up to 8,
  exported by our exporter from a small torch module (so it carries the exporter's manifest and warm-up);
- ``simple_int8``: the same in INT8;
- ``simple_string``: the same on decimal strings (BYTES [16]), an ONNX graph written by hand as another tool
  would, with a hand-written ``config.pbtxt``, no manifest and no ``model_warmup``;
- ``simple_identity``: a BYTES identity (``INPUT0`` -> ``OUTPUT0``, dims [-1], batching), also by hand.

Exporting takes seconds of CPU, so ``shared_simple_repository`` builds the repository once per test run (any
xdist worker) under a file lock, like ``tests/shared_exports.py``; tests read it and copy it before writing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import onnx
import pytest
from onnx import TensorProto, helper

from tests.shared_exports import locked, run_folder
from tests.slow_work import slow_work

if TYPE_CHECKING:
    import torch

ELEMENTS = 16
"""Every simple model's tensors hold 16 elements per row, as Triton's examples send them."""
MAX_BATCH_SIZE = 8
EXPORTED = ("simple", "simple_int8")
"""The models the exporter writes (the others are written by hand)."""
MODELS = (*EXPORTED, "simple_string", "simple_identity")
DONE = "built.json"
"""Written last: a shared folder without it is a build that did not finish."""

SIMPLE_STRING_CONFIG = """
name: "simple_string"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] }
input { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }
output { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] }
output { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }
"""
SIMPLE_IDENTITY_CONFIG = """
name: "simple_identity"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }
dynamic_batching { }
"""


def simple_inputs(dtype: npt.DTypeLike = np.int32) -> tuple[npt.NDArray[np.generic], npt.NDArray[np.generic]]:
    """What Triton's examples send: INPUT0 = 0..15, INPUT1 = all ones, one row."""
    return (np.arange(ELEMENTS, dtype=dtype).reshape(1, ELEMENTS),
            np.ones((1, ELEMENTS), dtype=dtype))


def as_strings(values: npt.NDArray[np.generic]) -> npt.NDArray[np.object_]:
    """Numbers as the decimal byte strings ``simple_string`` takes (an object array of ``bytes``)."""
    flat = np.array([str(int(v)).encode() for v in values.reshape(-1)], dtype=np.object_)
    return flat.reshape(values.shape)


def build_simple_repository(root: Path) -> Path:
    """Write the four models into ``root`` (created), each as version 1."""
    root.mkdir(parents=True, exist_ok=True)
    _export_add_sub(root, "simple", "int32")
    _export_add_sub(root, "simple_int8", "int8")
    _write_simple_string(root / "simple_string")
    _write_identity(root / "simple_identity")
    return root


def shared_simple_repository(factory: pytest.TempPathFactory) -> Path:
    """The repository built once for this test run (the first caller builds it, the others wait and reuse it).
    Read only: a test that writes to a repository copies it first (``copy_simple_repository``)."""
    folder = run_folder(factory) / "shared-simple-models"
    folder.mkdir(exist_ok=True)
    repository = folder / "model_repository"
    slow_work("uses Triton's simple models (exported)")
    with locked(folder / "lock"):
        if not (folder / DONE).exists():
            shutil.rmtree(repository, ignore_errors=True)  # a worker that died half way
            build_simple_repository(repository)
            (folder / DONE).write_text(json.dumps(list(MODELS)))
    return repository


def copy_simple_repository(source: Path, target: Path, models: tuple[str, ...] = MODELS) -> Path:
    """``models`` of ``source`` copied into ``target`` (created), for a test that changes its repository."""
    target.mkdir(parents=True, exist_ok=True)
    for model in models:
        shutil.copytree(source / model, target / model)
    return target


def _add_sub_module() -> torch.nn.Module:
    from torch import nn  # torch: only when exporting

    class AddSub(nn.Module):
        """Triton's ``simple``: the sum and the difference of two tensors."""

        def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> dict[str, torch.Tensor]:  # noqa: N803
            return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}

    return AddSub()


def _export_add_sub(root: Path, name: str, dtype: str) -> None:
    import torch

    from exporter import export

    kind = getattr(torch, dtype)
    # Small values: INT8 sums and differences of these stay in range, so parity compares no wrap-around.
    examples = {"INPUT0": torch.arange(2 * ELEMENTS, dtype=kind).reshape(2, ELEMENTS) % 50,
                "INPUT1": torch.ones(2, ELEMENTS, dtype=kind)}
    export(_add_sub_module(), examples, name=name, repository=root, version=1, max_batch_size=MAX_BATCH_SIZE)


def _write_simple_string(folder: Path) -> None:
    # Decimal strings to INT32 and back, as Triton's own simple_string does in its backends.
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    shape: list[str | int] = ["batch", ELEMENTS]
    graph = helper.make_graph(
        nodes, "simple_string",
        [helper.make_tensor_value_info(n, TensorProto.STRING, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.STRING, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    _save(folder, graph, SIMPLE_STRING_CONFIG)


def _write_identity(folder: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "simple_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", "n"])],
    )
    _save(folder, graph, SIMPLE_IDENTITY_CONFIG)


def _save(folder: Path, graph: onnx.GraphProto, config: str) -> None:
    (folder / "1").mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime of Triton 2.51 and ours both read
    onnx.checker.check_model(model)
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(config)
