"""Inputs the TorchScript-based ONNX exporter leaves out of the graph: it drops an input ``forward`` never reads (a
``token_type_ids`` kept for the signature's sake), yet config.pbtxt declares it and clients send it, and
onnxruntime refuses a request that feeds a name its graph lacks. Such an input goes back into the graph, unused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import torch
from onnx import TensorProto, helper

_ELEMENT_TYPES = {
    torch.bool: TensorProto.BOOL,
    torch.uint8: TensorProto.UINT8,
    torch.int8: TensorProto.INT8,
    torch.int16: TensorProto.INT16,
    torch.int32: TensorProto.INT32,
    torch.int64: TensorProto.INT64,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
    torch.float32: TensorProto.FLOAT,
    torch.float64: TensorProto.DOUBLE,
}
"""Every dtype ``exporter.dtypes`` serves."""

BATCH_AXIS = "batch"
"""The TorchScript-based exporter's label for axis 0 (``torch2onnx._export_legacy``)."""


def restore_dropped_inputs(
    path: Path,
    names: Sequence[str],
    examples: Sequence[torch.Tensor],
    extra_axes: Mapping[str, Mapping[int, str]],
) -> list[str]:
    """Put each of ``names`` missing from the graph at ``path`` back as a graph input, in ``forward``'s order, with
    its example's dtype and dims (the batch axis and ``extra_axes`` symbolic); returns the names restored."""
    model = onnx.load(str(path), load_external_data=False)  # external data stays where it is, beside the file
    present = {value.name for value in model.graph.input}
    dropped = [name for name in names if name not in present]
    if not dropped:
        return []
    by_name = {value.name: value for value in model.graph.input}
    for name, example in zip(names, examples, strict=True):
        if name in dropped:
            by_name[name] = _input_value(name, example, extra_axes.get(name, {}))
    ordered = [by_name[name] for name in names]
    others = [value for value in model.graph.input if value.name not in set(names)]  # initializers listed as inputs
    del model.graph.input[:]
    model.graph.input.extend([*ordered, *others])
    onnx.save(model, str(path))
    return dropped


def _input_value(name: str, example: torch.Tensor, axes: Mapping[int, str]) -> onnx.ValueInfoProto:
    shape: list[str | int] = [BATCH_AXIS if axis == 0 else axes.get(axis, int(size))
                              for axis, size in enumerate(example.shape)]
    return helper.make_tensor_value_info(name, _ELEMENT_TYPES[example.dtype], shape)
