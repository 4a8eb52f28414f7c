"""ONNX export: the torch.export-based (dynamo) exporter first, the TorchScript-based one only
when dynamo fails. Every input's and output's batch axis must come out dynamic."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch.export import Dim

from exporter.errors import DynamicBatchError, ExportError, UnsupportedOperatorError
from exporter.isolation import fresh_torch_state
from exporter.module_io import PreparedModel

DYNAMO = "torch.onnx.dynamo"
TORCHSCRIPT_ONNX = "torch.onnx.torchscript"

DynamicAxes = Mapping[str, Sequence[int] | Mapping[int, str]]


@dataclass(frozen=True)
class OnnxArtifact:
    path: Path
    exporter: str
    opset: int
    fallback_reason: str | None


def export_onnx(
    prepared: PreparedModel,
    path: Path,
    max_batch_size: int,
    dynamic_axes: DynamicAxes | None = None,
    opset: int | None = None,
) -> OnnxArtifact:
    extra_axes = _normalise_axes(prepared, dynamic_axes)
    examples = _at_least_two_rows(prepared.examples)
    with fresh_torch_state():
        try:
            _export_dynamo(prepared, examples, path, max_batch_size, extra_axes, opset)
            exporter, fallback_reason = DYNAMO, None
        except DynamicBatchError:
            raise
        except Exception as dynamo_error:
            fallback_reason = _summary(dynamo_error)
            try:
                _export_torchscript(prepared, examples, path, extra_axes, opset)
            except Exception as legacy_error:
                raise _explain(dynamo_error, legacy_error) from legacy_error
            exporter = TORCHSCRIPT_ONNX
    model = onnx.load(str(path), load_external_data=False)
    _check_batch_axes(model)
    opset_used = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OnnxArtifact(path, exporter, opset_used, fallback_reason)


def _normalise_axes(prepared: PreparedModel, dynamic_axes: DynamicAxes | None) -> dict[str, dict[int, str]]:
    result: dict[str, dict[int, str]] = {}
    known = set(prepared.input_names) | set(prepared.output_names)
    for name, axes in (dynamic_axes or {}).items():
        if name not in known:
            raise ExportError(f"dynamic_axes names {name!r}, which is not an input or output ({sorted(known)})")
        labelled = dict(axes) if isinstance(axes, Mapping) else {a: f"{name}_dim{a}" for a in axes}
        result[name] = {int(a): str(label) for a, label in labelled.items() if int(a) != 0}
    return result


def _at_least_two_rows(examples: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    # torch.export specialises a dimension of size 1 to a constant; give it two rows to trace.
    if examples[0].shape[0] >= 2:
        return examples
    return tuple(torch.cat([t, t]) for t in examples)


def _export_dynamo(
    prepared: PreparedModel,
    examples: tuple[torch.Tensor, ...],
    path: Path,
    max_batch_size: int,
    extra_axes: dict[str, dict[int, str]],
    opset: int | None,
) -> None:
    batch = Dim("batch", min=1, max=max(max_batch_size, 2))
    dims: dict[str, Dim] = {}
    per_input = []
    for name in prepared.input_names:
        spec: dict[int, Dim] = {0: batch}
        for axis, label in extra_axes.get(name, {}).items():
            spec[axis] = dims.setdefault(label, Dim(re.sub(r"\W", "_", label), min=1))
        per_input.append(spec)
    with _quiet():
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
    program.save(str(path))


def _export_torchscript(
    prepared: PreparedModel,
    examples: tuple[torch.Tensor, ...],
    path: Path,
    extra_axes: dict[str, dict[int, str]],
    opset: int | None,
) -> None:
    axes: dict[str, dict[int, str]] = {}
    for name in (*prepared.input_names, *prepared.output_names):
        axes[name] = {0: "batch", **extra_axes.get(name, {})}
    model: torch.nn.Module = prepared.flat.eval()
    with _quiet(), torch.no_grad():
        if any(isinstance(m, torch.jit.ScriptModule) for m in model.modules()):
            # This exporter takes a ScriptModule whole but not nested in a Python module: trace the flat
            # adapter around it (a trace keeps the scripted module's control flow as a call).
            model = torch.jit.trace(model, examples, check_trace=False, strict=False)  # type: ignore[no-untyped-call]
        torch.onnx.export(
            model,
            examples,
            str(path),
            dynamo=False,
            input_names=list(prepared.input_names),
            output_names=list(prepared.output_names),
            dynamic_axes=axes,
            opset_version=opset or 17,
        )


def _check_batch_axes(model: onnx.ModelProto) -> None:
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for value in values:
            dims = value.type.tensor_type.shape.dim
            if dims and not dims[0].dim_param:
                raise DynamicBatchError(
                    f"the exported ONNX {kind} {value.name!r} has a fixed batch axis (size {dims[0].dim_value}); "
                    "the model's code pins the batch size. Reshape with x.shape[0] (not a literal), avoid "
                    "x.view(N, ...) / torch.zeros(N, ...) with a fixed N, and keep every output's dim 0 the batch."
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


def _explain(dynamo_error: BaseException, legacy_error: BaseException) -> ExportError:
    op = _operator(dynamo_error, legacy_error)
    if op is not None:
        return UnsupportedOperatorError(
            f"neither ONNX exporter can convert the operator {op} (dynamo: {_summary(dynamo_error)[:200]}; "
            f"TorchScript-based: {_summary(legacy_error)[:200]}). Ways out: replace {op} with operators ONNX "
            "supports, move it out of the model into pre/post-processing, register a custom ONNX translation "
            "for it, or export with format='torchscript'.",
            operator=op,
        )
    return ExportError(
        f"ONNX export failed with both exporters. dynamo: {_summary(dynamo_error)} | TorchScript-based: "
        f"{_summary(legacy_error)}. Try format='torchscript', or simplify the failing part of forward()."
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters print progress and chatty warnings; the CLI shows its own progress instead."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "torch._export")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
