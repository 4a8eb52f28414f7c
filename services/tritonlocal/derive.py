"""Turns a model repository into one this CPU Triton (python backend only) can serve.

ONNX and TorchScript models get a python-backend twin: the config keeps names, dims, dtypes, ``max_batch_size``,
dynamic batching, instance counts (on CPU), version policy and warmup, swaps the onnxruntime/libtorch platform
for the python backend and names the model file in a parameter; every version folder gets the generic
``model.py`` beside a hard link (or copy) of the model file. Other models (TensorRT, python, ...) are linked as
they are, and this Triton loads them if it can. Serving a derived copy also keeps the python backend's
``__pycache__`` out of the source repository.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from services.modelrepo import layout
from services.modelrepo.config import ConfigError, override_json, read_config, to_text
from services.tritonlocal.errors import DerivedRepositoryError

__all__ = [
    "ARTIFACT_PARAMETER",
    "RUNTIME_PARAMETER",
    "DerivedModel",
    "DerivedRepository",
    "build_derived_repository",
    "derive_config",
]

MODEL_FILE = "model.py"
ARTIFACT_PARAMETER = "switchyard_artifact"
"""Config parameter naming the model file ``model.py`` runs (``model.onnx``, ``model.pt`` or the config's
``default_model_filename``); ``RUNTIME_PARAMETER`` says which runtime opens it (``onnx`` or ``torchscript``)."""
RUNTIME_PARAMETER = "switchyard_runtime"
_TWINNED = (layout.ONNX_PLATFORM, layout.TORCHSCRIPT_PLATFORM)
_MARKER = ".switchyard-derived"


def derive_config(config: mc.ModelConfig) -> mc.ModelConfig:
    """The python-backend twin of an ONNX or TorchScript config (a new message; the argument is untouched);
    other configs are returned as a copy, unchanged."""
    derived = mc.ModelConfig()
    derived.CopyFrom(config)
    if layout.platform(config) not in _TWINNED:
        return derived
    artifact = layout.model_filename(config)
    derived.ClearField("platform")
    derived.backend = "python"
    # Execution accelerators and the like configure onnxruntime/libtorch; the python backend rejects none of
    # them but honours none either, so they would only mislead.
    derived.ClearField("optimization")
    derived.ClearField("default_model_filename")  # the python backend would look for it instead of model.py
    derived.ClearField("cc_model_filenames")
    derived.parameters[ARTIFACT_PARAMETER].string_value = str(artifact)
    runtime = "onnx" if layout.platform(config) == layout.ONNX_PLATFORM else "torchscript"
    derived.parameters[RUNTIME_PARAMETER].string_value = runtime
    for group in derived.instance_group:  # this build runs on CPU only; keep the instance counts
        if group.kind in (mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_AUTO):
            group.kind = mc.ModelInstanceGroup.KIND_CPU
            group.ClearField("gpus")
    return derived


@dataclass(frozen=True)
class DerivedModel:
    name: str
    versions: tuple[int, ...]
    config: mc.ModelConfig


@dataclass(frozen=True)
class DerivedRepository:
    """What ``build_derived_repository`` produced; ``root`` is what tritonserver's ``--model-repository`` gets."""

    source: Path
    root: Path
    models: Mapping[str, DerivedModel]

    def config(self, model: str) -> mc.ModelConfig:
        try:
            return self.models[model].config
        except KeyError:
            raise DerivedRepositoryError(f"no model '{model}' in {self.source}") from None

    def config_json(self, model: str, versions: Sequence[int] | None = None) -> str:
        """The complete config as JSON for a load override, pinned to ``versions`` when given."""
        return override_json(self.config(model), versions)


def build_derived_repository(source: Path, target: Path) -> DerivedRepository:
    """Create or bring ``target`` up to date with ``source``; only what changed is rewritten.

    ``target`` must be empty, absent, or an earlier derived repository: models and versions gone from
    ``source`` are removed from it.
    """
    source, target = Path(source).resolve(), Path(target).resolve()
    if not source.is_dir():
        raise DerivedRepositoryError(f"model repository {source} does not exist; export a model into it first")
    if target == source or source in target.parents:
        raise DerivedRepositoryError(f"the derived repository {target} must lie outside {source}")
    if target.exists() and any(target.iterdir()) and not (target / _MARKER).exists():
        raise DerivedRepositoryError(f"{target} is not empty and was not made by switchyard; pick another directory")
    target.mkdir(parents=True, exist_ok=True)
    model_source = resources.files("services.tritonlocal").joinpath("python_model.py").read_text()
    with layout.locked_file(target / ".lock"):
        (target / _MARKER).touch()
        dirs = layout.model_dirs(source)
        models = {m.name: m for m in (_sync_model(d, target / d.name, model_source) for d in dirs)}
        _remove_except(target, keep={_MARKER, ".lock", *models})
    return DerivedRepository(source, target, models)


def _sync_model(source: Path, target: Path, model_source: str) -> DerivedModel:
    try:
        config = read_config(source)
    except ConfigError as exc:
        raise DerivedRepositoryError(str(exc)) from None
    derived = derive_config(config)
    twinned = derived.backend == "python" and ARTIFACT_PARAMETER in derived.parameters
    target.mkdir(exist_ok=True)
    _write_if_changed(target / layout.CONFIG_FILE, to_text(derived))
    keep = {layout.CONFIG_FILE}
    if (source / layout.WARMUP_DIR).is_dir():
        _sync_tree(source / layout.WARMUP_DIR, target / layout.WARMUP_DIR)
        keep.add(layout.WARMUP_DIR)
    for output in config.output:  # Triton's classification reads each output's labels from the model folder
        labels = output.label_filename
        if labels and "/" not in labels and (source / labels).is_file():
            _link_or_copy(source / labels, target / labels)
            keep.add(labels)
    versions = layout.versions(source, config)
    for version in versions:
        version_dir = target / str(version)
        if twinned:
            artifact = source / str(version) / derived.parameters[ARTIFACT_PARAMETER].string_value
            version_dir.mkdir(exist_ok=True)
            _write_if_changed(version_dir / MODEL_FILE, model_source)
            _link_tree_or_file(artifact, version_dir / artifact.name)
            _remove_except(version_dir, keep={MODEL_FILE, artifact.name, "__pycache__"})
        else:
            _sync_tree(source / str(version), version_dir)
        keep.add(str(version))
    _remove_except(target, keep=keep)
    return DerivedModel(source.name, versions, derived)


def _sync_tree(source: Path, target: Path) -> None:
    """Mirror ``source`` (files and folders, recursively) into ``target`` with hard links."""
    target.mkdir(exist_ok=True)
    names = set()
    for path in source.iterdir():
        if path.is_dir():
            _sync_tree(path, target / path.name)
        elif path.is_file():
            _link_or_copy(path, target / path.name)
        else:
            continue
        names.add(path.name)
    _remove_except(target, keep=names)


def _link_tree_or_file(source: Path, target: Path) -> None:
    if source.is_dir():  # an ONNX model with external data, a SavedModel
        _sync_tree(source, target)
    else:
        _link_or_copy(source, target)


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link costs no space and the backend never writes into the artifact; copy across filesystems."""
    if target.exists():
        a, b = source.stat(), target.stat()
        if target.samefile(source) or (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns):
            return
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(source, partial)
    except OSError:
        shutil.copy2(source, partial)
    os.replace(partial, target)


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def _remove_except(folder: Path, keep: Iterable[str]) -> None:
    kept = set(keep)
    for path in folder.iterdir():
        if path.name in kept:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
