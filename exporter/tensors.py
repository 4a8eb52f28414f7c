"""The served tensors: Triton's names per format, and dims with ``-1`` wherever an axis is dynamic (an output's
dims read off eager runs at the sizes the parity gate checks)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import torch

from exporter.errors import DynamicBatchError, InvalidSpecError, ModelError
from exporter.module_io import PreparedModel
from exporter.parity import parity_steps
from exporter.parity_draws import Stats, like_example
from exporter.specs import TensorSpec
from exporter.torch2onnx import DynamicAxes

_PROBE_SEED = 4321
"""Fixed, so that the same export declares the same dims every time."""


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
    batch_sizes: Sequence[int],
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The served tensors' specs. ``batch_sizes`` are those the parity gate checks: an output's dims are read off
    eager runs at those batch sizes and at the other sizes of the dynamic axes the gate checks, since one run cannot
    tell which output dims follow an input's size."""
    axes = dynamic_axes or {}
    first = 1 if prepared.batched else 0  # the tensor's axis that dims[0] describes
    ins = tuple(_served(n, dt_, tuple(-1 if i + first in _declared(axes, src) else d
                                      for i, d in enumerate(prepared.served_shape(t))))
                for n, dt_, src, t in zip(served_in, prepared.input_datatypes, prepared.input_names,
                                          prepared.examples, strict=True))
    dims = _output_dims(prepared, axes, batch_sizes)
    outs = tuple(_served(n, dt_, d) for n, dt_, d in zip(served_out, prepared.output_datatypes, dims, strict=True))
    return ins, outs


def resolve_dynamic_axes(prepared: PreparedModel, dynamic_axes: DynamicAxes | None) -> dict[str, dict[int, str]]:
    """``dynamic_axes`` with every axis a non-negative index of its tensor and a label (``<name>_dim<axis>`` where
    a list gave none), the batch axis left out (it is always dynamic); without a batch dim, axis 0 is an axis like
    the others, dynamic only where declared.

    Every later step reads the axes as non-negative indices: a negative one (``-1``, the last axis) would otherwise
    be dynamic in the ONNX file yet fixed in config.pbtxt and never resized by the parity gate, and one past the
    tensor's rank would be ignored without a word."""
    ranks = {name: t.dim() for name, t in zip(prepared.input_names, prepared.examples, strict=True)}
    ranks.update({name: t.dim() for name, t in zip(prepared.output_names, prepared.reference_outputs, strict=True)})
    resolved: dict[str, dict[int, str]] = {}
    for name, axes in (dynamic_axes or {}).items():
        if name not in ranks:
            raise InvalidSpecError(
                f"dynamic_axes names {name!r}, which is not an input or output of the model: name one of "
                f"{sorted(ranks)}"
            )
        labelled = axes.items() if isinstance(axes, Mapping) else ((axis, None) for axis in axes)
        for axis, label in labelled:
            index = _axis_index(name, axis, ranks[name], prepared.batched)
            if index != 0 or not prepared.batched:
                resolved.setdefault(name, {})[index] = str(label) if label is not None else f"{name}_dim{index}"
    return resolved


def _axis_index(name: str, axis: int, rank: int, batched: bool) -> int:
    index: int | None = None
    with contextlib.suppress(TypeError, ValueError):
        index = int(axis)  # what int() takes: numpy integers, "1"
    if index is None or not -rank <= index < rank:
        if not batched:
            held = f"axes 0 to {rank - 1}, or -{rank} to -1 counting from the last" if rank else "no axes (a scalar)"
            raise InvalidSpecError(
                f"dynamic_axes gives axis {axis!r} of {name!r}, which has {rank} axes for the example inputs, none of "
                f"them a batch axis (max_batch_size=0): give {held}"
            )
        if rank == 1:
            raise InvalidSpecError(
                f"dynamic_axes gives axis {axis!r} of {name!r}, which has only the batch axis (shape (batch,)), "
                "always dynamic: leave it out of dynamic_axes"
            )
        raise InvalidSpecError(
            f"dynamic_axes gives axis {axis!r} of {name!r}, which has {rank} axes for the example inputs (batch axis "
            f"0 included): give axes from 1 to {rank - 1}, or from -{rank} to -1 counting from the last"
        )
    return index % rank


def _served(name: str, datatype: str, dims: tuple[int, ...]) -> TensorSpec:
    """A tensor of shape (batch,) is served as (batch, 1) and reshaped to (batch,) for the model (Triton's
    convention for a scalar per row: it refuses a batched tensor with no dims)."""
    return TensorSpec(name, datatype, dims) if dims else TensorSpec(name, datatype, (1,), reshape=())


def input_dynamic_dims(prepared: PreparedModel, axes: DynamicAxes | None) -> dict[str, list[int]]:
    """Input name -> its dynamic axes other than the batch axis, for the parity check to resize."""
    result = {}
    batch_axis = {0} if prepared.batched else set()
    for name in prepared.input_names:
        dynamic = sorted(_declared(axes or {}, name) - batch_axis)
        if dynamic:
            result[name] = dynamic
    return result


def _declared(axes: DynamicAxes, name: str) -> set[int]:
    declared = axes.get(name, {})
    return {int(a) for a in (declared.keys() if isinstance(declared, Mapping) else declared)}


def _output_dims(prepared: PreparedModel, axes: DynamicAxes, batch_sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Each output's dims past the batch axis, ``-1`` where a dynamic input axis changes it.

    An output dim that changes with the batch size is refused: Triton's dynamic batcher concatenates requests along
    axis 0 and splits the outputs back along axis 0 only, so such an output (a Gram matrix ``y @ y.T``, a softmax
    over the batch) would give each request rows that depend on the other requests batched with it."""
    generator = torch.Generator().manual_seed(_PROBE_SEED)
    reference = [tuple(int(d) for d in t.shape) for t in prepared.reference_outputs]
    # Without a batch dim there are no batch sizes to probe, and axis 0 is an axis like the others.
    first = 1 if prepared.batched else 0
    for batch in (b for b in batch_sizes if prepared.batched and b != prepared.batch_size):
        probed = _probe(prepared, [(batch, *t.shape[1:]) for t in prepared.examples], generator)
        for name, ref, got in zip(prepared.output_names, reference, probed or reference, strict=True):
            # A first axis that is not the batch is the export check's and the parity gate's to explain.
            if got[0] == batch and got[1:] != ref[1:]:
                raise DynamicBatchError(
                    f"output {name!r} has shape {ref} for a batch of {ref[0]} but {got} for a batch of {batch}: "
                    "dims past its first follow the batch size, so each request's answer would depend on the "
                    "requests Triton's dynamic batcher puts beside it (it concatenates requests along axis 0 and "
                    "splits outputs along axis 0 only). Compute each row from its own input row (e.g. per-sample "
                    "y @ y.transpose(-1, -2) on a (batch, n, d) input instead of y @ y.T), or move the cross-batch "
                    "step into the client's post-processing."
                )
    dynamic = [_declared(axes, name) - set(range(first)) for name in prepared.input_names]
    varying: list[set[int]] = [set() for _ in reference]
    # Grow the dynamic axes as the parity gate does (``parity_steps``), at the example's batch size.
    for grow in sorted({grow for _, grow in parity_steps(batch_sizes, any(dynamic))} - {0}):
        shapes = [tuple(d + grow if axis in dyn else d for axis, d in enumerate(t.shape))
                  for t, dyn in zip(prepared.examples, dynamic, strict=True)]
        for seen, ref, got in zip(varying, reference, _probe(prepared, shapes, generator) or reference, strict=True):
            seen.update(axis for axis in range(first, len(ref)) if got[axis] != ref[axis])
    for seen, name in zip(varying, prepared.output_names, strict=True):
        seen |= _declared(axes, name)  # dynamic_axes may name outputs too
    return [tuple(-1 if axis in seen else d for axis, d in enumerate(ref) if axis >= first)
            for ref, seen in zip(reference, varying, strict=True)]


def _probe(
    prepared: PreparedModel, shapes: Sequence[Sequence[int]], generator: torch.Generator
) -> list[tuple[int, ...]] | None:
    """The output shapes of one eager run on fresh inputs of ``shapes``; ``None`` where forward raises there: the
    export and the parity gate run these sizes too, and explain the failure in their terms (a batch size the code
    pins, an operator's limit)."""
    inputs = tuple(like_example(Stats.of(t), tuple(shape), generator).to(t.device)
                   for t, shape in zip(prepared.examples, shapes, strict=True))
    try:
        with torch.no_grad():
            outputs = prepared.flat(*inputs)
    except Exception:
        return None
    found = [tuple(int(d) for d in o.shape) for o in outputs]
    for name, ref, got in zip(prepared.output_names, prepared.reference_outputs, found, strict=True):
        if len(got) != ref.dim():
            raise ModelError(
                f"output {name!r} has {ref.dim()} dims for the example inputs but {len(got)} for inputs of shapes "
                f"{[tuple(t.shape) for t in inputs]}; Triton declares a fixed number of dims per tensor, so keep "
                "the output's rank fixed."
            )
    return found
