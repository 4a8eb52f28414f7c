"""Reads a model repository: ``<model>/config.pbtxt`` and the versions its ``version_policy`` selects."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from exporter.manifest import MANIFEST_FILE
from services.gateway.datatypes import from_config
from services.gateway.errors import ModelNotFound
from services.gateway.types import ModelMetadata, TensorSpec

CONFIG_FILE = "config.pbtxt"


class RepositoryError(Exception):
    """The repository on disk is not usable (bad config, missing artifact)."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    config: model_config_pb2.ModelConfig
    available: tuple[int, ...]
    """Every version folder on disk (integer name, with a manifest), ascending."""

    @property
    def selected(self) -> tuple[int, ...]:
        """The versions the config's ``version_policy`` asks to serve."""
        return select_versions(self.config, self.available)

    def version_dir(self, version: int) -> Path:
        return self.path / str(version)

    def metadata(self, versions: tuple[int, ...]) -> ModelMetadata:
        return metadata_from_config(self.config, versions)


def read_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    path = model_dir / CONFIG_FILE
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except (OSError, text_format.ParseError) as exc:
        raise RepositoryError(f"cannot read {path}: {exc}") from exc
    if not config.name:
        config.name = model_dir.name
    return config


def available_versions(model_dir: Path) -> tuple[int, ...]:
    """Integer-named folders holding a manifest; temp folders (``.tmp-…``) and others are not versions."""
    found = [
        int(child.name)
        for child in model_dir.iterdir()
        if child.is_dir() and child.name.isdigit() and (child / MANIFEST_FILE).is_file()
    ]
    return tuple(sorted(found))


def select_versions(config: model_config_pb2.ModelConfig, available: tuple[int, ...]) -> tuple[int, ...]:
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return available
    if which == "specific":
        wanted = {int(v) for v in policy.specific.versions}
        return tuple(v for v in available if v in wanted)
    # Triton's default policy is latest { num_versions: 1 }.
    count = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
    return available[-count:]


def metadata_from_config(config: model_config_pb2.ModelConfig, versions: tuple[int, ...]) -> ModelMetadata:
    def specs(
        tensors: list[model_config_pb2.ModelInput] | list[model_config_pb2.ModelOutput],
    ) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(t.name, from_config(t.data_type), tuple(int(d) for d in t.dims)) for t in tensors)

    return ModelMetadata(
        name=config.name,
        versions=versions,
        platform=config.platform or config.backend,
        max_batch_size=int(config.max_batch_size),
        inputs=specs(list(config.input)),
        outputs=specs(list(config.output)),
    )


def scan(repository: Path) -> dict[str, ModelEntry]:
    """Every model folder with a ``config.pbtxt``, keyed by model name."""
    if not repository.is_dir():
        raise RepositoryError(f"model repository {repository} does not exist")
    entries: dict[str, ModelEntry] = {}
    for model_dir in sorted(repository.iterdir()):
        if model_dir.name.startswith(".") or not (model_dir / CONFIG_FILE).is_file():
            continue
        config = read_config(model_dir)
        entries[model_dir.name] = ModelEntry(model_dir.name, model_dir, config, available_versions(model_dir))
    return entries


def find(entries: dict[str, ModelEntry], model: str) -> ModelEntry:
    try:
        return entries[model]
    except KeyError:
        raise ModelNotFound(f"unknown model '{model}'") from None


def refresh(entries: dict[str, ModelEntry], model: str, version: int) -> ModelEntry:
    """Re-read which versions ``model`` has on disk (a version exported after startup counts) and return
    its updated entry; ``ModelNotFound`` if ``version`` is not among them. Blocking: call off the loop."""
    entry = find(entries, model)
    entry = replace(entry, available=available_versions(entry.path))
    entries[model] = entry
    if version not in entry.available:
        raise ModelNotFound(f"model '{model}' has no version {version} in the repository")
    return entry
