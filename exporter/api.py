"""``export()``: module -> verified artifact -> new numbered version in a Triton model repository."""

from __future__ import annotations

import datetime as dt
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
from torch import nn

from exporter.errors import ExportError, ParityError, RepositoryError
from exporter.manifest import (
    MANIFEST_FILE,
    SAMPLE_INPUTS_FILE,
    SAMPLE_OUTPUTS_FILE,
    SAMPLES_DIR,
    Manifest,
    TensorEntry,
)
from exporter.model_config import CONFIG_FILE, PLATFORMS, build_config, read_config, signature, to_text
from exporter.module_io import ExampleInputs, PreparedModel, prepare
from exporter.parity import (
    ParityReport,
    Runner,
    check_parity,
    default_tolerance,
    onnx_runner,
    parity_batch_sizes,
    torchscript_runner,
)
from exporter.repository import ModelRepository, sha256_files
from exporter.specs import DEFAULT_INSTANCES, ExportOptions, Format, Kind, TensorSpec, VersionPolicy
from exporter.torch2onnx import DynamicAxes, export_onnx
from exporter.torch2torchscript import TRACE, export_torchscript

ARTIFACTS = {"onnx": "model.onnx", "torchscript": "model.pt"}
STAGES = ("export", "check", "parity", "publish")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExportResult:
    name: str
    version: int
    model_dir: Path
    config_path: Path
    manifest_path: Path
    format: str
    exporter: str
    max_abs_error: float
    max_rel_error: float
    parity: ParityReport
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)


def export(
    module: nn.Module,
    example_inputs: ExampleInputs,
    name: str,
    repository: str | Path = "model_repository",
    format: Format = "onnx",
    max_batch_size: int = 32,
    version: int | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: DynamicAxes | None = None,
    *,
    instances: int = DEFAULT_INSTANCES,
    kind: Kind = "cpu",
    version_policy: str | VersionPolicy = "latest:1",
    max_queue_delay_us: int = 2000,
    preferred_batch_sizes: Sequence[int] = (),
    atol: float | None = None,
    rtol: float | None = None,
    opset: int | None = None,
    progress: Progress | None = None,
) -> ExportResult:
    """Export ``module`` and publish it as a new version of ``name``. See DESIGN.md for the contract.

    Raises ``ExportError`` (naming cause and fix) on any failure; the repository is then unchanged.
    """
    policy = VersionPolicy.parse(version_policy) if isinstance(version_policy, str) else version_policy
    options = ExportOptions(
        name=name, repository=str(repository), format=format, max_batch_size=max_batch_size,
        version=version, instances=instances, kind=kind, version_policy=policy,
        max_queue_delay_us=max_queue_delay_us, preferred_batch_sizes=tuple(preferred_batch_sizes),
        atol=atol, rtol=rtol, opset=opset,
    )
    report = progress or (lambda stage: None)
    repo = ModelRepository(options.repository)
    if options.version is not None and options.version in repo.versions(name):
        raise RepositoryError(
            f"version {options.version} of model {name!r} already exists in {repo.root}; omit the version "
            "to write the next free one"
        )
    was_training = module.training if isinstance(module, nn.Module) else False
    if isinstance(module, nn.Module):
        module.eval()  # serving is inference: dropout off, batch-norm running stats
    try:
        return _export(module, example_inputs, options, repo, input_names, output_names, dynamic_axes, report)
    finally:
        if was_training:
            module.train()


def _export(
    module: nn.Module,
    example_inputs: ExampleInputs,
    options: ExportOptions,
    repo: ModelRepository,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    dynamic_axes: DynamicAxes | None,
    report: Progress,
) -> ExportResult:
    report("export")
    prepared = prepare(module, example_inputs, input_names, output_names)
    if prepared.batch_size > options.max_batch_size:
        raise ExportError(
            f"the example inputs have batch {prepared.batch_size}, over max_batch_size={options.max_batch_size}"
        )
    served_in, served_out = _served_names(prepared, options.format)
    with repo.staging() as staging:
        version_dir = staging / "version"
        version_dir.mkdir()
        artifact_path = version_dir / ARTIFACTS[options.format]
        notes = list(prepared.notes)
        runner: Runner
        hint = ""
        if options.format == "onnx":
            onnx_artifact = export_onnx(prepared, artifact_path, options.max_batch_size, dynamic_axes, options.opset)
            exporter_used, opset = onnx_artifact.exporter, str(onnx_artifact.opset)
            if onnx_artifact.fallback_reason:
                notes.append(f"dynamo exporter failed ({onnx_artifact.fallback_reason}); used the "
                             "TorchScript-based ONNX exporter")
            report("check")
            runner = _guarded("onnxruntime", lambda: onnx_runner(artifact_path, prepared.input_names), prepared)
        else:
            if dynamic_axes:
                notes.append("dynamic_axes are implied by TorchScript (every dim is dynamic)")
            ts_artifact = export_torchscript(prepared, artifact_path)
            exporter_used, opset = ts_artifact.exporter, ""
            if ts_artifact.script_error:
                notes.append(f"torch.jit.script failed ({ts_artifact.script_error}); traced instead")
            if exporter_used == TRACE:
                hint = (
                    "The model was traced (scripting failed: " + str(ts_artifact.script_error) + "), and a "
                    "trace bakes data-dependent control flow (if on values, len(x), loops over shapes) into "
                    "constants" + (f"; the tracer warned: {' | '.join(ts_artifact.tracer_warnings)}"
                                   if ts_artifact.tracer_warnings else "")
                    + ". Make forward() scriptable with torch.jit.script, or export with format='onnx'."
                )
            report("check")
            runner = _guarded("torch.jit.load", lambda: torchscript_runner(artifact_path), prepared)
        report("parity")
        tolerance = default_tolerance(prepared)
        parity = check_parity(
            prepared, runner, parity_batch_sizes(options.max_batch_size),
            atol=options.atol if options.atol is not None else tolerance,
            rtol=options.rtol if options.rtol is not None else tolerance,
            hint=hint, dynamic_dims=_input_dynamic_dims(prepared, dynamic_axes),
        )
        in_specs, out_specs = _tensor_specs(prepared, served_in, served_out, dynamic_axes, options.format)
        report("publish")
        _write_samples(version_dir, prepared, served_in, served_out)
        warmup_dims = {n: list(t.shape[1:]) for n, t in zip(served_in, prepared.examples, strict=True)}
        config = build_config(options, in_specs, out_specs, warmup_dims)
        warmup = {n: t[:1].contiguous().cpu().numpy().tobytes()
                  for n, t in zip(served_in, prepared.examples, strict=True)}
        with repo.locked():
            version = options.version if options.version is not None else repo.next_version(options.name)
            _check_compatible(repo, options.name, config)
            manifest = Manifest(
                name=options.name, version=version, format=options.format, platform=PLATFORMS[options.format],
                artifact=ARTIFACTS[options.format], exporter=exporter_used,
                max_batch_size=options.max_batch_size,
                inputs=[_entry(s, src) for s, src in zip(in_specs, prepared.input_names, strict=True)],
                outputs=[_entry(s, src) for s, src in zip(out_specs, prepared.output_names, strict=True)],
                files=sha256_files(version_dir), toolchain=_toolchain(opset), parity=parity.as_dict(),
                created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), notes=notes,
            )
            (version_dir / MANIFEST_FILE).write_text(manifest.to_json())
            model_dir = repo.publish(options.name, version, version_dir, to_text(config), warmup)
    return ExportResult(
        name=options.name, version=version, model_dir=model_dir,
        config_path=repo.model_dir(options.name) / CONFIG_FILE, manifest_path=model_dir / MANIFEST_FILE,
        format=options.format, exporter=exporter_used, max_abs_error=parity.max_abs_error,
        max_rel_error=parity.max_rel_error, parity=parity, inputs=in_specs, outputs=out_specs,
        notes=tuple(notes),
    )


def _served_names(prepared: PreparedModel, fmt: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if fmt == "torchscript":
        # Triton's libtorch backend binds tensors by position through the INPUT__i / OUTPUT__i names.
        return (tuple(f"INPUT__{i}" for i in range(len(prepared.input_names))),
                tuple(f"OUTPUT__{i}" for i in range(len(prepared.output_names))))
    return prepared.input_names, prepared.output_names


def _tensor_specs(
    prepared: PreparedModel,
    served_in: tuple[str, ...],
    served_out: tuple[str, ...],
    dynamic_axes: DynamicAxes | None,
    fmt: str,
) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    axes = dynamic_axes or {}

    def dims(source: str, shape: torch.Size) -> tuple[int, ...]:
        declared = axes.get(source, {})
        dynamic = {int(a) for a in (declared.keys() if isinstance(declared, Mapping) else declared)}
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


def _input_dynamic_dims(prepared: PreparedModel, axes: DynamicAxes | None) -> dict[str, list[int]]:
    result = {}
    for name in prepared.input_names:
        declared = (axes or {}).get(name, {})
        dynamic = sorted({int(a) for a in (declared.keys() if isinstance(declared, Mapping) else declared)} - {0})
        if dynamic:
            result[name] = dynamic
    return result


def _widen_output_dims(
    prepared: PreparedModel, outs: tuple[TensorSpec, ...], axes: DynamicAxes
) -> tuple[TensorSpec, ...]:
    if not axes:
        return outs
    resized = []
    for name, t in zip(prepared.input_names, prepared.examples, strict=True):
        declared = axes.get(name, {})
        dyn = {int(a) for a in (declared.keys() if isinstance(declared, Mapping) else declared)} - {0}
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


def _entry(spec: TensorSpec, source: str) -> TensorEntry:
    return TensorEntry(name=spec.name, datatype=spec.datatype, dims=list(spec.dims), source=source)


def _write_samples(
    version_dir: Path, prepared: PreparedModel, served_in: tuple[str, ...], served_out: tuple[str, ...]
) -> None:
    (version_dir / SAMPLES_DIR).mkdir()
    inputs = {n: t.cpu().numpy() for n, t in zip(served_in, prepared.examples, strict=True)}
    outputs = {n: t.cpu().numpy() for n, t in zip(served_out, prepared.reference_outputs, strict=True)}
    np.savez(version_dir / SAMPLE_INPUTS_FILE, **inputs)  # type: ignore[arg-type]
    np.savez(version_dir / SAMPLE_OUTPUTS_FILE, **outputs)  # type: ignore[arg-type]


def _check_compatible(repo: ModelRepository, name: str, config: Any) -> None:
    path = repo.model_dir(name) / CONFIG_FILE
    if not path.exists():
        return
    existing = read_config(path)
    if signature(existing) != signature(config):
        raise RepositoryError(
            f"model {name!r} already has versions {repo.versions(name)} with another platform or input/output "
            f"signature ({path}); all versions share one config.pbtxt. Export under a new model name, or keep "
            "the same tensor names, dtypes and dims."
        )


def _guarded(engine: str, make_runner: Callable[[], Runner], prepared: PreparedModel) -> Runner:
    """Loading or running the artifact in its serving engine is part of the check: explain failures."""

    def explain(exc: Exception, dtypes: set[str]) -> ParityError:
        low_precision = bool(dtypes & {"float16", "bfloat16"})
        return ParityError(
            f"{engine} could not run the exported model: {type(exc).__name__}: {str(exc).strip()[:400]}. "
            + ("fp16/bf16 kernels are missing for some operators on CPU: export in fp32 (model.float()) "
               "for CPU serving, or export and verify on a GPU machine." if low_precision else
               "The artifact is not servable as written; check the operators named above.")
        )

    try:
        runner = make_runner()
    except Exception as exc:
        raise explain(exc, {str(p.dtype).removeprefix("torch.") for p in prepared.flat.parameters()}) from exc

    def run(inputs: tuple[torch.Tensor, ...]) -> list[Any]:
        try:
            return runner(inputs)
        except Exception as exc:
            raise explain(exc, {str(t.dtype).removeprefix("torch.") for t in inputs}) from exc

    return run


def _toolchain(opset: str) -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "opset": opset,
    }
