"""``config.pbtxt`` for an export, built as a Triton ``ModelConfig`` protobuf; ``services.modelrepo.config``
reads and writes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc

from exporter.dtypes import config_type
from exporter.errors import RepositoryError
from exporter.specs import ExportOptions, Format, TensorSpec, VersionPolicy
from services.modelrepo import config as repo_config
from services.modelrepo.layout import ONNX_PLATFORM, TORCHSCRIPT_PLATFORM, model_filename

PLATFORMS: dict[Format, str] = {"onnx": ONNX_PLATFORM, "torchscript": TORCHSCRIPT_PLATFORM}
QUEUE_TIMEOUT_CAP_US = 300_000_000
"""Longest a request may wait in Triton's (and the embedded batcher's) queue; requests set shorter deadlines."""


def build_config(
    options: ExportOptions,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    warmup_dims: Mapping[str, Sequence[int]],
) -> mc.ModelConfig:
    """``warmup_dims`` gives, per input, the concrete dims (no batch) of the sample in ``warmup/<input>``."""
    config = mc.ModelConfig(
        name=options.name,
        platform=PLATFORMS[options.format],
        max_batch_size=options.max_batch_size,
    )
    for spec in inputs:
        _set_reshape(config.input.add(name=spec.name, data_type=_dtype(spec), dims=list(spec.dims)), spec)
    for spec in outputs:
        _set_reshape(config.output.add(name=spec.name, data_type=_dtype(spec), dims=list(spec.dims)), spec)
    if options.batched:  # a model without a batch dim has no batcher: each request runs as it comes
        _set_dynamic_batching(config.dynamic_batching, options)
    kind = mc.ModelInstanceGroup.KIND_GPU if options.kind == "gpu" else mc.ModelInstanceGroup.KIND_CPU
    config.instance_group.add(count=options.instances, kind=kind)
    _set_version_policy(config.version_policy, options.version_policy)
    warmup = config.model_warmup.add(name="sample_request", batch_size=1)
    for spec in inputs:
        warmup.inputs[spec.name].data_type = _dtype(spec)
        warmup.inputs[spec.name].dims.extend(warmup_dims[spec.name])
        warmup.inputs[spec.name].input_data_file = spec.name
    return config


def _set_dynamic_batching(batching: mc.ModelDynamicBatching, options: ExportOptions) -> None:
    batching.max_queue_delay_microseconds = options.queue_delay_us
    batching.preferred_batch_size.extend(options.preferred_batch_sizes)
    if options.priority_levels:
        batching.priority_levels = options.priority_levels
        batching.default_priority_level = (options.priority_levels + 1) // 2
    # Triton ignores a request's v2 ``timeout`` unless the queue policy allows overriding, and it only takes
    # overrides shorter than the default timeout (0 = none, which no override beats): so a generous cap.
    batching.default_queue_policy.allow_timeout_override = True
    batching.default_queue_policy.default_timeout_microseconds = QUEUE_TIMEOUT_CAP_US


def _set_reshape(tensor: mc.ModelInput | mc.ModelOutput, spec: TensorSpec) -> None:
    if spec.reshape is not None:
        tensor.reshape.SetInParent()  # written even when the shape is empty: reshape {} means a scalar per row
        tensor.reshape.shape.extend(spec.reshape)


def served_dims(dims: Sequence[int]) -> list[int]:
    """The dims (no batch dim) clients send for a tensor the model takes with ``dims`` (``TensorSpec.reshape``)."""
    return list(dims) or [1]


def _dtype(spec: TensorSpec) -> int:
    return int(mc.DataType.Value(config_type(spec.datatype)))


def _set_version_policy(target: mc.ModelVersionPolicy, policy: VersionPolicy) -> None:
    if policy.kind == "all":
        target.all.SetInParent()
    elif policy.kind == "specific":
        target.specific.versions.extend(policy.versions)
    else:
        target.latest.num_versions = policy.num_versions


def artifact_name(fmt: Format) -> str:
    """The model file a version folder of this format holds, as the repository layout names it."""
    filename = model_filename(mc.ModelConfig(platform=PLATFORMS[fmt]))
    if filename is None:  # pragma: no cover - the layout names a file for both platforms
        raise RepositoryError(f"the repository layout names no model file for platform {PLATFORMS[fmt]}")
    return filename


def read_config(model_dir: Path) -> mc.ModelConfig:
    """The config every version of the model in ``model_dir`` shares."""
    try:
        return repo_config.read_config(model_dir)
    except repo_config.ConfigError as exc:
        raise RepositoryError(
            f"{exc}. Every version of model {model_dir.name!r} shares this config: fix it, or export under "
            "a new model name."
        ) from exc


def signature(config: mc.ModelConfig) -> tuple[object, ...]:
    """What every version of a model must agree on, since they share one ``config.pbtxt``: the same dims mean
    per-row shapes with a batch dim and whole tensors without one, so whether it batches is part of it."""
    return (
        config.platform,
        config.max_batch_size > 0,
        tuple((t.name, t.data_type, tuple(t.dims), _reshape(t)) for t in config.input),
        tuple((t.name, t.data_type, tuple(t.dims), _reshape(t)) for t in config.output),
    )


def _reshape(tensor: mc.ModelInput | mc.ModelOutput) -> tuple[int, ...] | None:
    """The model's own shape where a reshape sets it: dims [1] reaching the model as (batch,) or as (batch, 1) are
    different models."""
    return tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None


def signature_differences(existing: mc.ModelConfig, new: mc.ModelConfig) -> list[str]:
    """Where ``new`` departs from the signature of ``existing``, one line per platform or tensor, both sides named."""
    differences = []
    if existing.platform != new.platform:
        differences.append(f"platform: {existing.platform or existing.backend} there, {new.platform} here")
    if (existing.max_batch_size > 0) != (new.max_batch_size > 0):
        differences.append(f"batch dim: {_batching_text(existing)} there, {_batching_text(new)} here")
    for kind, old, fresh in (("input", existing.input, new.input), ("output", existing.output, new.output)):
        for index in range(max(len(old), len(fresh))):
            there = _tensor_text(old[index]) if index < len(old) else "none"
            here = _tensor_text(fresh[index]) if index < len(fresh) else "none"
            if there != here:
                differences.append(f"{kind} {index}: {there} there, {here} here")
    return differences


def _batching_text(config: mc.ModelConfig) -> str:
    if config.max_batch_size > 0:
        return f"max_batch_size {config.max_batch_size} (dims without the batch dim)"
    return "max_batch_size 0 (no batch dim, dims are whole shapes)"


def _tensor_text(tensor: mc.ModelInput | mc.ModelOutput) -> str:
    datatype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
    reshape = _reshape(tensor)
    return f"{tensor.name} {datatype} {list(tensor.dims)}" + ("" if reshape is None else f" reshape {list(reshape)}")


_NOT_COMPARED = {"name", "platform", "backend", "input", "output", "model_warmup"}
"""Left out of ``config_changes``: the signature (a new version must keep it, ``signature_differences``), and the
warm-up sample, which every export writes afresh."""


def config_changes(existing: mc.ModelConfig, new: mc.ModelConfig) -> list[str]:
    """What a new export's config.pbtxt changes in the one it replaces (it is shared by every version of the model),
    one line per top-level field: ``version_policy: all {} -> latest { num_versions: 1 }``."""
    changes = []
    for field in mc.ModelConfig.DESCRIPTOR.fields:
        if field.name in _NOT_COMPARED:
            continue
        there, here = _field_text(existing, field), _field_text(new, field)
        if there != here:
            changes.append(f"{field.name}: {there} -> {here}")
    return changes


def _field_text(config: mc.ModelConfig, field: FieldDescriptor) -> str:
    """One field on one line; ``(unset)`` where the config leaves it out."""
    value = getattr(config, field.name)
    if field.is_repeated:
        items = [_one_line(v) if field.message_type is not None else repr(v) for v in value]
        return f"[{', '.join(items)}]" if items else "(unset)"
    if field.message_type is not None:
        return _one_line(value) if config.HasField(field.name) else "(unset)"
    return repr(value)


def _one_line(message: Message) -> str:
    return "{ " + text_format.MessageToString(message, as_one_line=True).strip() + " }"
