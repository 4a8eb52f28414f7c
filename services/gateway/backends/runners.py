"""Blocking model runners for the embedded backend; they are called from a thread pool (onnxruntime and
libtorch release the GIL while they compute). torch is imported only when a TorchScript model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from services.extras import require
from services.gateway.types import Array
from services.modelrepo import layout


class Runner(Protocol):
    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        """Inputs and outputs keyed by config tensor name, batch dim first."""


class UnsupportedModel(Exception):
    """A model the embedded backend cannot run by design (its platform, or an extra that is not installed)."""


def check_supported(platform: str) -> None:
    """Raise ``UnsupportedModel`` naming why a model of ``platform`` cannot run in this process."""
    if platform == layout.ONNX_PLATFORM:
        return
    if platform == layout.TORCHSCRIPT_PLATFORM:
        require("torch", extra="export", feature="serving a TorchScript model in the embedded backend")
        return
    raise UnsupportedModel(
        f"platform/backend {platform or '(none)'!r} cannot run in the embedded backend, which runs "
        f"{layout.ONNX_PLATFORM} and {layout.TORCHSCRIPT_PLATFORM} models; serve it with --backend triton"
    )


def build_runner(
    platform: str, path: Path, inputs: list[str], outputs: list[str], *, threads: int, spinning: bool
) -> Runner:
    if platform == layout.ONNX_PLATFORM:
        return OnnxRunner(path, outputs, intra_op_threads=threads, spinning=spinning)
    check_supported(platform)
    return TorchScriptRunner(path, inputs, outputs, threads=threads)


class OnnxRunner:
    def __init__(self, path: Path, output_names: list[str], *, intra_op_threads: int, spinning: bool) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning intra-op threads burn the cores the event loop needs between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        self._session: Any = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._outputs = output_names

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        results = self._session.run(self._outputs, inputs)
        return dict(zip(self._outputs, results, strict=True))


class TorchScriptRunner:
    def __init__(self, path: Path, input_names: list[str], output_names: list[str], *, threads: int) -> None:
        self._torch: Any = require("torch", extra="export", feature="serving a TorchScript model")
        self._torch.set_num_threads(threads)
        self._module = self._torch.jit.load(str(path), map_location="cpu").eval()
        self._inputs = input_names
        self._outputs = output_names

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        torch = self._torch
        # torch.from_numpy shares memory but refuses read-only buffers (frombuffer'd request bodies).
        args = [torch.from_numpy(_writable(inputs[name])) for name in self._inputs]
        with torch.inference_mode():
            result = self._module(*args)
        if isinstance(result, torch.Tensor):
            values = [result]
        elif isinstance(result, dict):
            values = [result[name] for name in self._outputs]
        else:
            values = list(result)
        if len(values) != len(self._outputs):
            raise RuntimeError(f"TorchScript module returned {len(values)} outputs, config lists {len(self._outputs)}")
        return {name: value.numpy() for name, value in zip(self._outputs, values, strict=True)}


def _writable(array: Array) -> Array:
    return array if array.flags.writeable else np.array(array)
