"""Write the model file in the chosen format, then open it in its serving engine (onnxruntime or
``torch.jit.load``) as the runner the parity check compares against eager PyTorch, on the device the export is for
when this process has it (``exporter.parity_device``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exporter.errors import ParityError
from exporter.module_io import PreparedModel
from exporter.parity import Runner, onnx_runner, torchscript_runner
from exporter.parity_device import ON_CPU, ParityDevice, choose_parity_device
from exporter.specs import ExportOptions
from exporter.torch2onnx import SCRIPTED_ONNX, DynamicAxes, export_onnx
from exporter.torch2torchscript import TRACE, export_torchscript

Progress = Callable[[str], None]
"""Called with each stage name (``STAGES`` in ``exporter.api``) as the export enters it."""


@dataclass(frozen=True)
class Artifact:
    exporter: str
    """Which exporter wrote the file (``torch.onnx.dynamo``, ``torch.jit.script``...)."""
    opset: str
    """The ONNX opset; empty for TorchScript."""
    runner: Runner
    notes: tuple[str, ...]
    traced: str
    """How a trace made the file, when one did (a frozen decision is then what parity suspects first)."""
    device: ParityDevice = ON_CPU
    """Where ``runner`` runs, and where eager PyTorch must run beside it."""


def write_artifact(
    prepared: PreparedModel, path: Path, options: ExportOptions, dynamic_axes: DynamicAxes | None, report: Progress
) -> Artifact:
    """Export to ``path``; reports the ``check`` stage once the file is written and is being loaded."""
    if options.format == "onnx":
        return _onnx(prepared, path, options, dynamic_axes, report)
    return _torchscript(prepared, path, options, dynamic_axes, report)


def _onnx(
    prepared: PreparedModel, path: Path, options: ExportOptions, dynamic_axes: DynamicAxes | None, report: Progress
) -> Artifact:
    written = export_onnx(prepared, path, options.max_batch_size, dynamic_axes, options.opset)
    notes = []
    traced = ""
    if written.exporter == SCRIPTED_ONNX:
        notes.append(f"forward() decides on data ({written.fallback_reason}); scripted, each decision exported "
                     "as an ONNX If")
    elif written.fallback_reason:
        notes.append(f"dynamo exporter failed ({written.fallback_reason}); used the "
                     "TorchScript-based ONNX exporter")
        traced = "the TorchScript-based ONNX exporter traced the model (dynamo failed)"
    if written.restored_inputs:
        notes.append(f"forward() never reads {', '.join(map(repr, written.restored_inputs))}: the TorchScript-based "
                     "ONNX exporter dropped it from the graph, which takes it back, unused, as clients send it")
    report("check")
    device = choose_parity_device(options.kind, options.format)
    runner, device = _guarded("onnxruntime", lambda: onnx_runner(path, prepared.input_names, device), prepared)
    return Artifact(written.exporter, str(written.opset), runner, tuple(notes), traced, device)


def _torchscript(
    prepared: PreparedModel, path: Path, options: ExportOptions, dynamic_axes: DynamicAxes | None, report: Progress
) -> Artifact:
    notes = []
    if dynamic_axes:
        notes.append("dynamic_axes are implied by TorchScript (every dim is dynamic)")
    written = export_torchscript(prepared, path)
    if written.script_error:
        notes.append(f"torch.jit.script failed ({written.script_error}); traced instead")
    traced = f"the model was traced (scripting failed: {written.script_error})" if written.exporter == TRACE else ""
    report("check")
    device = choose_parity_device(options.kind, options.format)
    runner, device = _guarded("torch.jit.load", lambda: torchscript_runner(path, device), prepared)
    return Artifact(written.exporter, "", runner, tuple(notes), traced, device)


def _guarded(
    engine: str, make_runner: Callable[[], tuple[Runner, ParityDevice]], prepared: PreparedModel
) -> tuple[Runner, ParityDevice]:
    """Loading or running the artifact in its serving engine is part of the check: explain failures."""
    example_shapes = [tuple(t.shape) for t in prepared.examples]

    def explain(exc: Exception, dtypes: set[str], shapes: list[tuple[int, ...]] | None = None) -> ParityError:
        low_precision = bool(dtypes & {"float16", "bfloat16"})
        where = "" if shapes is None else " on inputs of shapes " + ", ".join(
            f"{name} {list(shape)}" for name, shape in zip(prepared.input_names, shapes, strict=True))
        if low_precision:
            hint = ("fp16/bf16 kernels are missing for some operators on CPU: export in fp32 (model.float()) for CPU "
                    "serving, or export and verify on a GPU machine.")
        elif shapes is not None and shapes != example_shapes:
            examples = ", ".join(f"{n} {list(s)}" for n, s in zip(prepared.input_names, example_shapes, strict=True))
            hint = (f"The file was written from the example inputs ({examples}) and fails at other sizes: its graph "
                    "fixes a size the model computes from an input's shape (a reshape or view to the example's "
                    "length, say). Export with format='torchscript' (every dim stays dynamic), compute that size "
                    "from x.shape in forward(), or leave the axis out of dynamic_axes and export one model per size.")
        else:
            hint = "The artifact is not servable as written; check the operators named above."
        return ParityError(
            f"{engine} could not run the exported model{where}: {type(exc).__name__}: {str(exc).strip()[:400]}. "
            + hint
        )

    try:
        runner, device = make_runner()
    except Exception as exc:
        raise explain(exc, {str(p.dtype).removeprefix("torch.") for p in prepared.flat.parameters()}) from exc

    def run(inputs: tuple[torch.Tensor, ...]) -> list[Any]:
        try:
            return runner(inputs)
        except Exception as exc:
            raise explain(exc, {str(t.dtype).removeprefix("torch.") for t in inputs},
                          [tuple(t.shape) for t in inputs]) from exc

    return run, device
