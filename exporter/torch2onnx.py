"""ONNX export: the torch.export-based (dynamo) exporter first; the TorchScript-based one only when dynamo fails.

Where ``forward`` decides on data (``exporter.control_flow``), a trace would freeze one way of the decision, so the
decision is kept instead: the module is scripted and converted with each ``if`` as an ONNX ``If``. A trace that
still decides on data is refused. Every input's and output's batch axis must come out dynamic; a model without a
batch dim (``PreparedModel.batched`` false) has only the axes ``dynamic_axes`` declares dynamic, axis 0 included."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch.export import Dim

from exporter.control_flow import (
    AxisRange,
    ScriptedConversionError,
    control_flow_error,
    is_data_dependent,
    narrowed_axes,
    recorded_decisions,
    traced_decisions,
)
from exporter.errors import DynamicBatchError, ExportError, InvalidSpecError, UnsupportedOperatorError
from exporter.isolation import fresh_torch_state
from exporter.module_io import FlatModule, PreparedModel
from exporter.onnx_inputs import restore_dropped_inputs
from exporter.onnx_translations import shared_translations
from exporter.parity import onnx_runner
from exporter.parity_draws import Stats, like_example

DYNAMO = "torch.onnx.dynamo"
TORCHSCRIPT_ONNX = "torch.onnx.torchscript"
SCRIPTED_ONNX = "torch.jit.script+torch.onnx.torchscript"
"""Scripted first, so that each data-dependent ``if`` becomes an ONNX ``If`` with both branches."""
LEGACY_OPSET = 17
_SIZE_PROBE_SEED = 2468

DynamicAxes = Mapping[str, Sequence[int] | Mapping[int, str]]


@dataclass(frozen=True)
class _Job:
    """One export's inputs, as the TorchScript-based paths take them."""

    prepared: PreparedModel
    examples: tuple[torch.Tensor, ...]
    path: Path
    extra_axes: dict[str, dict[int, str]]
    opset: int | None


@dataclass(frozen=True)
class OnnxArtifact:
    path: Path
    exporter: str
    opset: int
    fallback_reason: str | None
    restored_inputs: tuple[str, ...] = ()
    """Inputs forward() never reads, which the TorchScript-based exporter dropped and the graph got back."""


def export_onnx(
    prepared: PreparedModel,
    path: Path,
    max_batch_size: int,
    dynamic_axes: DynamicAxes | None = None,
    opset: int | None = None,
) -> OnnxArtifact:
    if opset is not None:
        check_opset(opset)
    extra_axes = _normalise_axes(prepared, dynamic_axes)
    examples = _at_least_two_rows(prepared.examples) if prepared.batched else prepared.examples
    with fresh_torch_state():
        exporter, fallback_reason = _capture(prepared, examples, path, max_batch_size, extra_axes, opset)
    restored = () if exporter == DYNAMO else tuple(
        restore_dropped_inputs(path, prepared.input_names, prepared.examples, extra_axes))
    model = onnx.load(str(path), load_external_data=False)
    if prepared.batched:
        _check_batch_axes(model)
    _check_dynamic_axes(model, extra_axes, exporter)
    opset_used = _opset(model)
    if opset is not None and opset_used != opset:  # a file for another opset than asked is never published
        raise ExportError(
            f"opset={opset} was asked for, but {exporter} wrote opset {opset_used} ({fallback_reason or 'it chose'}): "
            f"a runtime that needs opset {opset} may refuse the file. Ask for an opset the exporters can write for "
            "this model (e.g. 17 or newer), or leave opset unset."
        )
    return OnnxArtifact(path, exporter, opset_used, fallback_reason, restored)


def check_opset(opset: int) -> None:
    """Refuse, before minutes of exporting, an opset neither installed exporter can write: the torch.export-based
    one writes its own and converts it to others up to torch's newest, the TorchScript-based one writes its range."""
    from torch.onnx import _constants

    lowest = _constants.ONNX_MIN_OPSET
    legacy_highest = _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    highest = max(_constants.ONNX_MAX_OPSET, legacy_highest)
    if not lowest <= opset <= highest:
        raise InvalidSpecError(
            f"opset={opset} is not one the installed ONNX exporters can write: torch {torch.__version__} writes "
            f"opsets {lowest} to {highest} (the torch.export-based exporter converts its own to {highest} at most, "
            f"the TorchScript-based one writes {lowest} to {legacy_highest}). Ask for an opset in that range that "
            "your runtime loads (Triton's onnxruntime backend lists the opsets it supports), or leave opset unset."
        )


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _capture(
    prepared: PreparedModel,
    examples: tuple[torch.Tensor, ...],
    path: Path,
    max_batch_size: int,
    extra_axes: dict[str, dict[int, str]],
    opset: int | None,
) -> tuple[str, str | None]:
    """Write the file; returns which exporter did and, when it was not dynamo, why not."""
    batch_range: AxisRange = (1, max(max_batch_size, 2))
    batch_axis: dict[int, AxisRange] = {0: batch_range} if prepared.batched else {}
    requested = {name: {**batch_axis, **dict.fromkeys(extra_axes.get(name, {}), (1, None))}
                 for name in prepared.input_names}
    try:
        program = _export_dynamo(prepared, examples, max_batch_size, extra_axes, opset)
    except DynamicBatchError:
        raise
    except Exception as dynamo_error:
        decides = is_data_dependent(dynamo_error)
        reason = "torch.export refused a data-dependent decision" if decides else _summary(dynamo_error)
        return _fallback(_Job(prepared, examples, path, extra_axes, opset), reason, dynamo_error, decides=decides)
    captured = program.exported_program
    narrowed = narrowed_axes(captured, prepared.input_names, requested) if captured is not None else []
    # A narrowed batch axis is a decision on the batch size; a narrowed other axis usually is an operator's need
    # (a kernel larger than the input), and a decision only where a trace of forward shows one.
    reason = "torch.export narrowed " + "; ".join(n.text for n in narrowed)
    narrowed_batch = prepared.batched and any(n.axis == 0 for n in narrowed)
    if narrowed and (narrowed_batch or traced_decisions(prepared.flat, examples)):
        return _fallback(_Job(prepared, examples, path, extra_axes, opset), reason, reason, decides=True)
    if any(n.pinned for n in narrowed):
        # torch.export fixed a dynamic axis to the example's size where an operator's shape logic did not generalise
        # (Conv1d + MaxPool1d over a sequence): its file would take that one size. The TorchScript-based exporter
        # keeps the axis symbolic; _check_dynamic_axes and the parity gate at other sizes verify that it did.
        return _fallback(_Job(prepared, examples, path, extra_axes, opset), reason, reason, decides=False)
    program.save(str(path))
    written = _opset(onnx.load(str(path), load_external_data=False))
    if opset is not None and written != opset:
        # torch.export's exporter writes its own opset and converts down to the one asked for; where the conversion
        # fails it keeps its own, saying so only in a warning. The TorchScript-based exporter writes older opsets.
        reason = f"torch.export's exporter wrote opset {written}, not the opset {opset} asked for"
        _remove_written(path)
        return _fallback(_Job(prepared, examples, path, extra_axes, opset), reason, reason, decides=False)
    elsewhere = _fails_at_other_sizes(prepared, path, extra_axes)
    if elsewhere is not None:
        # torch.export kept the inputs dynamic but baked the example's size into the graph (an LSTM over a
        # transposed sequence reshapes to the traced length): the TorchScript-based exporter keeps such sizes
        # symbolic; the parity gate then checks its file at every size.
        _remove_written(path)
        return _fallback(_Job(prepared, examples, path, extra_axes, opset), elsewhere, elsewhere, decides=False)
    return DYNAMO, None


def _fails_at_other_sizes(
    prepared: PreparedModel, path: Path, extra_axes: Mapping[str, Mapping[int, str]]
) -> str | None:
    """Why onnxruntime cannot run the file at a size it was not captured at (batch 1, each dynamic axis one longer
    than the example's), when it can at the example's own; ``None`` when it runs, or fails at the example's too
    (that is no size problem, and the parity gate explains it)."""
    try:
        # A file that declares a fixed axis is the model's pitfall, which those checks name; no other exporter helps.
        model = onnx.load(str(path), load_external_data=False)
        if prepared.batched:
            _check_batch_axes(model)
        _check_dynamic_axes(model, extra_axes, DYNAMO)
    except ExportError:
        return None
    generator = torch.Generator().manual_seed(_SIZE_PROBE_SEED)
    try:
        run, _ = onnx_runner(path, prepared.input_names)
    except Exception:
        return None  # the check stage loads the file again and explains why it cannot
    shapes = [tuple(1 if axis == 0 and prepared.batched else size + (axis in extra_axes.get(name, {}))
                    for axis, size in enumerate(t.shape))
              for name, t in zip(prepared.input_names, prepared.examples, strict=True)]
    try:
        run(tuple(like_example(Stats.of(t), shape, generator) for t, shape in zip(prepared.examples, shapes,
                                                                                     strict=True)))
    except Exception as exc:
        try:
            run(tuple(t.cpu() for t in prepared.examples))
        except Exception:
            return None
        where = ", ".join(f"{n} {list(s)}" for n, s in zip(prepared.input_names, shapes, strict=True))
        return f"the torch.export-based file runs at the example's shapes but not at {where}: {_first_line(exc)}"
    return None


def _first_line(error: BaseException) -> str:
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return (lines[0] if lines else type(error).__name__)[:300]


def _remove_written(path: Path) -> None:
    """The dynamo file and any external data beside it, so the fallback's file is the only one left."""
    for written in path.parent.glob(path.name + "*"):
        written.unlink()


def _fallback(job: _Job, reason: str, dynamo_error: BaseException | str, *, decides: bool) -> tuple[str, str]:
    """The TorchScript-based exporter: scripted where ``forward`` decides on data, traced otherwise."""
    script_error: BaseException | None = None
    if decides:
        script_error = _scripted_or_error(job)
        if script_error is None:
            return SCRIPTED_ONNX, reason
    with recorded_decisions() as decisions:
        try:
            _export_traced(job)
        except Exception as legacy_error:
            traced_error: Exception | None = legacy_error
        else:
            traced_error = None
    if decisions and not decides:
        # dynamo failed for another reason, yet the trace decided on data: keep the decision if scripting can.
        script_error = _scripted_or_error(job)
        if script_error is None:
            return SCRIPTED_ONNX, reason
    if decisions:
        if not decides:
            evidence = f"torch.export failed for another reason ({reason[:200]}), so the model was traced"
        else:
            evidence = reason
        raise control_flow_error(decisions, fmt="onnx", evidence=evidence, script_error=script_error)
    if traced_error is not None:
        raise _explain(dynamo_error, traced_error) from traced_error
    return TORCHSCRIPT_ONNX, reason


def _normalise_axes(prepared: PreparedModel, dynamic_axes: DynamicAxes | None) -> dict[str, dict[int, str]]:
    result: dict[str, dict[int, str]] = {}
    known = set(prepared.input_names) | set(prepared.output_names)
    for name, axes in (dynamic_axes or {}).items():
        if name not in known:
            raise ExportError(f"dynamic_axes names {name!r}, which is not an input or output ({sorted(known)})")
        labelled = dict(axes) if isinstance(axes, Mapping) else {a: f"{name}_dim{a}" for a in axes}
        # Axis 0 is the batch, dynamic anyway, unless the model has no batch dim.
        result[name] = {int(a): str(label) for a, label in labelled.items() if int(a) != 0 or not prepared.batched}
    return result


def _at_least_two_rows(examples: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    # torch.export specialises a dimension of size 1 to a constant; give it two rows to trace.
    if examples[0].shape[0] >= 2:
        return examples
    return tuple(torch.cat([t, t]) for t in examples)


def _export_dynamo(
    prepared: PreparedModel,
    examples: tuple[torch.Tensor, ...],
    max_batch_size: int,
    extra_axes: dict[str, dict[int, str]],
    opset: int | None,
) -> torch.onnx.ONNXProgram:
    batch = Dim("batch", min=1, max=max(max_batch_size, 2))
    dims: dict[str, Dim] = {}
    per_input = []
    for name in prepared.input_names:
        spec: dict[int, Dim] = {0: batch} if prepared.batched else {}
        for axis, label in extra_axes.get(name, {}).items():
            spec[axis] = dims.setdefault(label, Dim(re.sub(r"\W", "_", label), min=1))
        per_input.append(spec)
    with shared_translations():
        program = torch.onnx.export(
            prepared.flat.eval(),
            examples,
            None,
            dynamo=True,
            input_names=list(prepared.input_names),
            output_names=list(prepared.output_names),
            dynamic_shapes=(tuple(per_input),),
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    if program is None:  # pragma: no cover - dynamo always returns a program
        raise ExportError("torch.onnx.export returned no program")
    return program


def _export_traced(job: _Job) -> None:
    _export_legacy(job.prepared.flat.eval(), job)


def _export_scripted(job: _Job) -> None:
    scripted = torch.jit.script(job.prepared.flat.inner)
    try:
        _export_legacy(FlatModule(scripted, job.prepared.flat.keyword_names).eval(), job)
    except Exception as exc:
        raise ScriptedConversionError(exc) from exc


def _scripted_or_error(job: _Job) -> Exception | None:
    """Export the scripted model; the failure, if any, for the refusal to quote."""
    try:
        _export_scripted(job)
    except Exception as exc:
        return exc
    return None


def _export_legacy(model: torch.nn.Module, job: _Job) -> None:
    prepared = job.prepared
    axes: dict[str, dict[int, str]] = {}
    batch: dict[int, str] = {0: "batch"} if prepared.batched else {}
    for name in (*prepared.input_names, *prepared.output_names):
        axes[name] = {**batch, **job.extra_axes.get(name, {})}
    with torch.no_grad():
        if any(isinstance(m, torch.jit.ScriptModule) for m in model.modules()):
            # This exporter takes a ScriptModule whole but not nested in a Python module: trace the flat
            # adapter around it (a trace keeps the scripted module's control flow as a call).
            model = torch.jit.trace(  # type: ignore[no-untyped-call]
                model, job.examples, check_trace=False, strict=False
            )
        torch.onnx.export(
            model,
            job.examples,
            str(job.path),
            dynamo=False,
            input_names=list(prepared.input_names),
            output_names=list(prepared.output_names),
            dynamic_axes=axes,
            opset_version=job.opset or LEGACY_OPSET,
        )


def _check_batch_axes(model: onnx.ModelProto) -> None:
    # Below IR version 4 (old opsets) every weight is listed as a graph input too: those are no inputs of the model's.
    weights = {initializer.name for initializer in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in weights]
    for kind, values in (("input", inputs), ("output", model.graph.output)):
        for value in values:
            dims = value.type.tensor_type.shape.dim
            if dims and not dims[0].dim_param:
                raise DynamicBatchError(
                    f"the exported ONNX {kind} {value.name!r} has a fixed batch axis (size {dims[0].dim_value}); "
                    "the model's code pins the batch size. Reshape with x.shape[0] (not a literal), avoid "
                    "x.view(N, ...) / torch.zeros(N, ...) with a fixed N, and keep every output's dim 0 the batch."
                )


def _check_dynamic_axes(model: onnx.ModelProto, extra_axes: Mapping[str, Mapping[int, str]], exporter: str) -> None:
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        for axis in extra_axes.get(value.name, {}):
            if axis < len(dims) and dims[axis].WhichOneof("value") == "dim_value":
                raise ExportError(
                    f"axis {axis} of input {value.name!r} was asked to be dynamic, but the exported ONNX graph "
                    f"fixes it at {dims[axis].dim_value} (the example's size): the exporter that wrote it "
                    f"({exporter}) specialised the model's code to that size, so the file would refuse every other "
                    "size. Export with format='torchscript' (every dim stays dynamic there), or leave the axis out "
                    "of dynamic_axes (--input with its size instead of -1) and export one model per size."
                )


_OP_PATTERNS = (
    re.compile(r"OpOverload\(op='([\w.:]+)'"),
    re.compile(r"operator '([\w.:]+)'"),
    re.compile(r"No ONNX function found for ([\w.:]+)"),
)


def _operator(*errors: BaseException) -> str | None:
    for error in errors:
        text = _full_text(error)
        for pattern in _OP_PATTERNS:
            match = pattern.search(text)
            if match:
                return match.group(1).replace("::", ".")
    return None


def _full_text(error: BaseException) -> str:
    parts = []
    seen: BaseException | None = error
    while seen is not None:
        parts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def _summary(error: BaseException) -> str:
    text = str(error)
    marker = text.find("## Exception summary")
    if marker >= 0:
        text = text[marker + len("## Exception summary"):]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("(Refer")]
    return " ".join(lines)[:500] or type(error).__name__


def _explain(dynamo_error: BaseException | str, legacy_error: BaseException) -> ExportError:
    dynamo_summary = dynamo_error if isinstance(dynamo_error, str) else _summary(dynamo_error)
    op = _operator(legacy_error) if isinstance(dynamo_error, str) else _operator(dynamo_error, legacy_error)
    if op is not None:
        return UnsupportedOperatorError(
            f"neither ONNX exporter can convert the operator {op} (dynamo: {dynamo_summary[:200]}; "
            f"TorchScript-based: {_summary(legacy_error)[:200]}). Ways out: replace {op} with operators ONNX "
            "supports, move it out of the model into pre/post-processing, register a custom ONNX translation "
            "for it, or export with format='torchscript'.",
            operator=op,
        )
    return ExportError(
        f"ONNX export failed with both exporters. dynamo: {dynamo_summary} | TorchScript-based: "
        f"{_summary(legacy_error)}. Try format='torchscript', or simplify the failing part of forward()."
    )
