"""``export()``: module -> verified artifact -> new numbered version in a Triton model repository."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn
from tritonclient.grpc import model_config_pb2 as mc

from exporter.artifacts import Progress, write_artifact
from exporter.diagnostics import LOG_FILE, captured
from exporter.dtypes import raw_bytes
from exporter.errors import ExportError, InvalidSpecError, RepositoryError
from exporter.model_config import (
    artifact_name,
    build_config,
    config_changes,
    read_config,
    served_dims,
    signature,
    signature_differences,
)
from exporter.module_io import ExampleInputs, prepare
from exporter.module_state import kept_state
from exporter.parity import ParityReport, check_parity, default_tolerance, parity_batch_sizes
from exporter.parity_device import eager_on
from exporter.records import write_manifest, write_samples
from exporter.repository import ModelRepository
from exporter.specs import DEFAULT_INSTANCES, ExportOptions, Format, Kind, TensorSpec, VersionPolicy, batch_size_list
from exporter.tensors import input_dynamic_dims, resolve_dynamic_axes, served_names, tensor_specs
from exporter.torch2onnx import DynamicAxes
from services.modelrepo import layout
from services.modelrepo.config import select_versions, to_text
from services.modelrepo.layout import CONFIG_FILE, MANIFEST_FILE

STAGES = ("export", "check", "parity", "publish")


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
    released: bool = True
    """Whether a gateway with no routing state for the model may serve this version as stable by itself (a model's
    first version, or ``release=True``); otherwise it serves unversioned requests once activated."""
    config_changes: tuple[str, ...] = ()
    """What this export changed in the model's shared config.pbtxt (version policy, batching, instances...), one
    line per field, as ``model_config.config_changes`` words it; empty for a first version or an unchanged config."""


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
    max_queue_delay_us: int | None = None,
    preferred_batch_sizes: Sequence[int] = (),
    priority_levels: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    opset: int | None = None,
    release: bool | None = None,
    progress: Progress | None = None,
    verbose: bool = False,
) -> ExportResult:
    """Export ``module`` and publish it as a new version of ``name`` (the contract: the README, "Exporting a model").

    Raises ``ExportError`` (naming cause and fix) on any failure; the repository then holds no new version, only
    the exporters' diagnostics in its hidden log folder (``ExportError.log_path``). ``verbose`` shows those
    diagnostics on stderr as they come instead.
    """
    policy = VersionPolicy.parse(version_policy) if isinstance(version_policy, str) else version_policy
    options = ExportOptions(
        name=name, repository=str(repository), format=format, max_batch_size=max_batch_size,
        version=version, instances=instances, kind=kind, version_policy=policy,
        max_queue_delay_us=max_queue_delay_us, preferred_batch_sizes=batch_size_list(preferred_batch_sizes),
        priority_levels=priority_levels, atol=atol, rtol=rtol, opset=opset, release=release,
    )
    report = progress or (lambda stage: None)
    repo = ModelRepository(options.repository)
    if options.version is not None and options.version in repo.versions(name):
        raise RepositoryError(
            f"version {options.version} of model {name!r} already exists in {repo.root}; omit the version "
            "to write the next free one"
        )
    if not isinstance(module, nn.Module):  # prepare() refuses it, naming what it got
        return _export(module, example_inputs, options, repo, input_names, output_names, dynamic_axes, report, verbose)
    with kept_state(module):
        return _export(module, example_inputs, options, repo, input_names, output_names, dynamic_axes, report, verbose)


def _export(
    module: nn.Module,
    example_inputs: ExampleInputs,
    options: ExportOptions,
    repo: ModelRepository,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    dynamic_axes: DynamicAxes | None,
    report: Progress,
    verbose: bool,
) -> ExportResult:
    report("export")
    prepared = prepare(module, example_inputs, input_names, output_names, batched=options.batched)
    dynamic_axes = resolve_dynamic_axes(prepared, dynamic_axes)
    if options.batched and prepared.batch_size > options.max_batch_size:
        raise ExportError(
            f"the example inputs have batch {prepared.batch_size}, over max_batch_size={options.max_batch_size}: "
            f"give examples of at most {options.max_batch_size} rows (--example-batch on the command line), or "
            "raise max_batch_size"
        )
    served_in, served_out = served_names(prepared, options.format)
    in_specs, out_specs = tensor_specs(prepared, served_in, served_out, dynamic_axes,
                                     parity_batch_sizes(options.max_batch_size))
    warmup_dims = {n: served_dims(prepared.served_shape(t)) for n, t in zip(served_in, prepared.examples, strict=True)}
    config = build_config(options, in_specs, out_specs, warmup_dims)
    _check_compatible(repo, options.name, config)  # before minutes of exporting; again under the lock
    _check_policy_selects(repo, options, config, options.version or repo.next_version(options.name))
    with repo.staging() as staging:
        version_dir = staging / "version"
        version_dir.mkdir()
        artifact_path = version_dir / artifact_name(options.format)
        log = staging / LOG_FILE
        try:
            with captured(None if verbose else log):
                artifact = write_artifact(prepared, artifact_path, options, dynamic_axes, report)
                report("parity")
                tolerance = default_tolerance(prepared)
                with eager_on(prepared.flat, artifact.device.eager):
                    parity = check_parity(
                        prepared, artifact.runner, parity_batch_sizes(options.max_batch_size),
                        atol=options.atol if options.atol is not None else tolerance,
                        rtol=options.rtol if options.rtol is not None else tolerance,
                        traced=artifact.traced, dynamic_dims=input_dynamic_dims(prepared, dynamic_axes),
                        device=artifact.device, merges_requests=options.max_batch_size > 1,
                    )
        except ExportError as exc:
            exc.log_path = repo.keep_log(log, options.name)
            raise
        except Exception:
            repo.keep_log(log, options.name)
            raise
        notes = [*prepared.notes, *artifact.notes]
        report("publish")
        # One row of a batched model (Triton repeats it ``batch_size`` times); a whole request of an unbatched one.
        warmup = {n: raw_bytes(t[:1] if prepared.batched else t) for n, t in zip(served_in, prepared.examples,
                                                                                 strict=True)}
        try:
            write_samples(version_dir, prepared, served_in, served_out)
            with repo.locked():
                version = options.version if options.version is not None else repo.next_version(options.name)
                _check_compatible(repo, options.name, config)
                _check_policy_selects(repo, options, config, version)
                replaced = _config_changes(repo, options.name, config)
                released = options.release if options.release is not None else not repo.versions(options.name)
                write_manifest(
                    version_dir, options, version, released=released, platform=config.platform,
                    artifact=artifact_path.name, exporter=artifact.exporter, opset=artifact.opset, prepared=prepared,
                    inputs=in_specs, outputs=out_specs, parity=parity, notes=notes,
                )
                model_dir = repo.publish(options.name, version, version_dir, to_text(config), warmup)
        except OSError as exc:  # a full disk, a permission changed under the export
            raise repo.unwritable_error(exc) from exc
    return ExportResult(
        name=options.name, version=version, model_dir=model_dir,
        config_path=repo.model_dir(options.name) / CONFIG_FILE, manifest_path=model_dir / MANIFEST_FILE,
        format=options.format, exporter=artifact.exporter, max_abs_error=parity.max_abs_error,
        max_rel_error=parity.max_rel_error, parity=parity, inputs=in_specs, outputs=out_specs,
        notes=tuple(notes), released=released, config_changes=tuple(replaced),
    )


def _config_changes(repo: ModelRepository, name: str, config: mc.ModelConfig) -> list[str]:
    model_dir = repo.model_dir(name)
    return config_changes(read_config(model_dir), config) if (model_dir / CONFIG_FILE).exists() else []


def _check_policy_selects(repo: ModelRepository, options: ExportOptions, config: mc.ModelConfig, version: int) -> None:
    """Refuse a version policy that selects none of the model's versions once this one is published: Triton then
    refuses to load the model at all ("at least one version must be available under the version policy"), and
    the shared config.pbtxt would take the model's earlier versions down with it."""
    model_dir = repo.model_dir(options.name)
    available = {*(layout.versions(model_dir, config) if model_dir.is_dir() else ()), version}
    if select_versions(config, available):
        return
    policy = options.version_policy
    listed = ",".join(str(v) for v in policy.versions)
    raise InvalidSpecError(
        f"version policy specific:{listed} selects none of the versions model {options.name!r} would have, "
        f"{sorted(available)} (version {version} being this export): Triton refuses to load a model whose policy "
        "selects no version, and all versions share one config.pbtxt, so the model would stop serving. List versions "
        f"that exist (e.g. specific:{version}), or use latest:N or all."
    )


def _check_compatible(repo: ModelRepository, name: str, config: mc.ModelConfig) -> None:
    model_dir = repo.model_dir(name)
    if not (model_dir / CONFIG_FILE).exists():
        return
    existing = read_config(model_dir)
    if signature(existing) != signature(config):
        differences = "; ".join(signature_differences(existing, config))
        raise RepositoryError(
            f"model {name!r} already has versions {repo.versions(name)} whose signature differs from this export's "
            f"({differences}), and all versions share one config.pbtxt ({model_dir / CONFIG_FILE}). Export under a "
            "new model name (name=..., --name on the command line), or give the tensors the existing names, dtypes "
            "and dims (input_names= / output_names=, --input / --output)."
        )
