"""The served tensors: Triton's names per format, and dims with ``-1`` wherever an axis is dynamic."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from exporter.errors import InvalidSpecError
from exporter.module_io import PreparedModel
from exporter.specs import TensorSpec
from exporter.torch2onnx import DynamicAxes


def served_names(prepared: PreparedModel, fmt: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if fmt == "torchscript":
        # Triton's libtorch backend binds tensors by position through the INPUT__i / OUTPUT__i names.
        return (tuple(f"INPUT__{i}" for i in range(len(prepared.input_names))),
                tuple(f"OUTPUT__{i}" for i in range(len(prepared.output_names))))
    shared = sorted(set(prepared.input_names) & set(prepared.output_names))
    if shared:
        # ONNX names every value once in a graph; onnxruntime would refuse the file as "Duplicate definition".
        raise InvalidSpecError(
            f"{shared} would name both an input and an output, and an ONNX graph needs distinct names: pass "
            "input_names=[...] or output_names=[...] to rename one side"
        )
    return prepared.input_names, prepared.output_names


def tensor_specs(
    prepared: PreparedModel,
    served_in: tuple[str, ...],
    served_out: tuple[str, ...],
    dynamic_axes: DynamicAxes | None,
    fmt: str,
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    axes = dynamic_axes or {}

    def dims(source: str, shape: torch.Size) -> tuple[int, ...]:
        dynamic = _declared(axes, source)
        return tuple(-1 if i + 1 in dynamic else int(d) for i, d in enumerate(shape[1:]))

    ins = tuple(TensorSpec(n, dt_, dims(src, t.shape)) for n, dt_, src, t in
                zip(served_in, prepared.input_datatypes, prepared.input_names, prepared.examples, strict=True))
    outs = tuple(TensorSpec(n, dt_, dims(src, t.shape)) for n, dt_, src, t in
                 zip(served_out, prepared.output_datatypes, prepared.output_names, prepared.reference_outputs,
                     strict=True))
    if fmt == "torchscript" or any(axes):
        # Output dims that follow a dynamic input dim cannot be read off one eager run: mark any dim
        # that is not fixed across the example and a resized run as dynamic.
        outs = _widen_output_dims(prepared, outs, axes)
    return ins, outs


def input_dynamic_dims(prepared: PreparedModel, axes: DynamicAxes | None) -> dict[str, list[int]]:
    """Input name -> its dynamic axes other than the batch axis, for the parity check to resize."""
    result = {}
    for name in prepared.input_names:
        dynamic = sorted(_declared(axes or {}, name) - {0})
        if dynamic:
            result[name] = dynamic
    return result


def _declared(axes: DynamicAxes, name: str) -> set[int]:
    declared = axes.get(name, {})
    return {int(a) for a in (declared.keys() if isinstance(declared, Mapping) else declared)}


def _widen_output_dims(
    prepared: PreparedModel, outs: tuple[TensorSpec, ...], axes: DynamicAxes
) -> tuple[TensorSpec, ...]:
    if not axes:
        return outs
    resized = []
    for name, t in zip(prepared.input_names, prepared.examples, strict=True):
        dyn = _declared(axes, name) - {0}
        shape = [d + 1 if i in dyn else d for i, d in enumerate(t.shape)]
        resized.append(_grow(t, shape) if dyn else t)
    with torch.no_grad():
        other = prepared.flat(*resized)
    return tuple(
        TensorSpec(s.name, s.datatype, tuple(-1 if d != int(o.shape[i + 1]) else d for i, d in enumerate(s.dims)))
        for s, o in zip(outs, other, strict=True)
    )


def _grow(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    grown = torch.zeros(shape, dtype=t.dtype)
    grown[tuple(slice(0, d) for d in t.shape)] = t
    return grown
