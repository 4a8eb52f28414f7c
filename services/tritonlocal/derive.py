"""Turns an exporter repository into one this CPU Triton (python backend only) can serve.

Per model the config keeps names, dims, dtypes, ``max_batch_size``, dynamic batching, instance counts
(on CPU), version policy and warmup, and swaps the onnxruntime/libtorch platform for the python backend; every
version folder gets the generic ``model.py`` beside a hard link (or copy) of its artifact. Serving a
derived copy also keeps the python backend's ``__pycache__`` out of the exporter's repository.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.tritonlocal.errors import DerivedRepositoryError

__all__ = [
    "ARTIFACTS",
    "DerivedModel",
    "DerivedRepository",
    "build_derived_repository",
    "derive_config",
    "override_json",
]

CONFIG_FILE = "config.pbtxt"
WARMUP_DIR = "warmup"
MODEL_FILE = "model.py"
ARTIFACTS = ("model.onnx", "model.pt")
_MARKER = ".switchyard-derived"


def derive_config(config: mc.ModelConfig) -> mc.ModelConfig:
    """The python-backend twin of an exporter config (a new message; the argument is untouched)."""
    derived = mc.ModelConfig()
    derived.CopyFrom(config)
    derived.ClearField("platform")
    derived.backend = "python"
    # Execution accelerators and the like configure onnxruntime/libtorch; the python backend rejects none of
    # them but honours none either, so they would only mislead.
    derived.ClearField("optimization")
    derived.ClearField("default_model_filename")  # the python backend would look for it instead of model.py
    derived.ClearField("cc_model_filenames")
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
        """The complete config as JSON for a load override, pinned to ``versions`` when given.

        Triton replaces ``config.pbtxt`` with the override instead of merging, so it must be complete.
        """
        return override_json(self.config(model), versions)


def override_json(config: mc.ModelConfig, versions: Sequence[int] | None = None) -> str:
    """``config`` as the JSON a repository load override takes, with a ``specific`` policy when ``versions``."""
    message = mc.ModelConfig()
    message.CopyFrom(config)
    if versions is not None:
        message.version_policy.specific.versions[:] = sorted(set(versions))
    return json_format.MessageToJson(message, preserving_proto_field_name=True)


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
    with _locked(target):
        (target / _MARKER).touch()
        models = {m.name: m for m in (_sync_model(d, target / d.name, model_source) for d in _model_dirs(source))}
        _remove_except(target, keep={_MARKER, ".lock", *models})
    return DerivedRepository(source, target, models)


def _model_dirs(source: Path) -> Iterator[Path]:
    # Hidden folders are the exporter's staging area: never half a model.
    for path in sorted(source.iterdir()):
        if path.is_dir() and not path.name.startswith(".") and (path / CONFIG_FILE).is_file():
            yield path


def _sync_model(source: Path, target: Path, model_source: str) -> DerivedModel:
    try:
        config = text_format.Parse((source / CONFIG_FILE).read_text(), mc.ModelConfig())
    except text_format.ParseError as exc:
        raise DerivedRepositoryError(f"{source / CONFIG_FILE} is not a valid Triton model config: {exc}") from exc
    if config.name and config.name != source.name:
        raise DerivedRepositoryError(f"{source / CONFIG_FILE} names model '{config.name}' but lies in {source.name}/")
    derived = derive_config(config)
    derived.name = source.name
    target.mkdir(exist_ok=True)
    _write_if_changed(target / CONFIG_FILE, text_format.MessageToString(derived))
    keep = {CONFIG_FILE}
    if (source / WARMUP_DIR).is_dir():
        _sync_tree(source / WARMUP_DIR, target / WARMUP_DIR)
        keep.add(WARMUP_DIR)
    versions = []
    for folder in sorted(source.iterdir(), key=lambda p: p.name):
        artifact = next((folder / a for a in ARTIFACTS if (folder / a).is_file()), None)
        if not folder.name.isdigit() or artifact is None:
            continue
        version_dir = target / folder.name
        version_dir.mkdir(exist_ok=True)
        _write_if_changed(version_dir / MODEL_FILE, model_source)
        _link_or_copy(artifact, version_dir / artifact.name)
        _remove_except(version_dir, keep={MODEL_FILE, artifact.name, "__pycache__"})
        keep.add(folder.name)
        versions.append(int(folder.name))
    _remove_except(target, keep=keep)
    return DerivedModel(source.name, tuple(sorted(versions)), derived)


def _sync_tree(source: Path, target: Path) -> None:
    target.mkdir(exist_ok=True)
    names = set()
    for path in source.iterdir():
        if path.is_file():
            _link_or_copy(path, target / path.name)
            names.add(path.name)
    _remove_except(target, keep=names)


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


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Two launchers building the same derived repository take turns."""
    with (target / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
