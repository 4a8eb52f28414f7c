"""The gateway's view of a model repository: each model's config, the versions on disk and the ones its
``version_policy`` selects. Any Triton repository works; the exporter's manifest is optional."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from services.gateway.datatypes import from_config
from services.gateway.errors import ModelNotFound
from services.gateway.types import ModelMetadata, TensorSpec
from services.modelrepo import layout
from services.modelrepo.config import ConfigError, read_config, select_versions


class RepositoryError(Exception):
    """The repository on disk is not usable (missing folder, bad config)."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    config: model_config_pb2.ModelConfig
    available: tuple[int, ...]
    """Every version folder on disk (integer name, holding the model file the config names), ascending."""
    problem: str | None = None
    """Why the model cannot be served at all (an unreadable config); ``None`` when it can be tried."""

    @property
    def selected(self) -> tuple[int, ...]:
        """The versions the config's ``version_policy`` asks to serve."""
        return select_versions(self.config, self.available)

    @property
    def platform(self) -> str:
        return layout.platform(self.config)

    def version_dir(self, version: int) -> Path:
        return self.path / str(version)

    def model_path(self, version: int) -> Path | None:
        return layout.model_path(self.path, version, self.config)

    def metadata(self, versions: tuple[int, ...]) -> ModelMetadata:
        return metadata_from_config(self.config, versions)


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


def read_entry(model_dir: Path) -> ModelEntry:
    """One model folder; a config that cannot be read gives an entry with its ``problem`` instead of failing the
    whole repository: the other models still serve. Blocking: call off the loop."""
    try:
        config = read_config(model_dir)
    except ConfigError as exc:
        return ModelEntry(model_dir.name, model_dir, model_config_pb2.ModelConfig(name=model_dir.name), (), str(exc))
    return ModelEntry(model_dir.name, model_dir, config, layout.versions(model_dir, config))


def scan(repository: Path) -> dict[str, ModelEntry]:
    """Every model folder with a ``config.pbtxt``, keyed by model name. Blocking: call off the loop."""
    if not repository.is_dir():
        raise RepositoryError(f"model repository {repository} does not exist")
    return {model_dir.name: read_entry(model_dir) for model_dir in layout.model_dirs(repository)}


def find(entries: dict[str, ModelEntry], model: str) -> ModelEntry:
    try:
        return entries[model]
    except KeyError:
        raise ModelNotFound(f"unknown model '{model}'") from None


def refresh(entries: dict[str, ModelEntry], model: str, version: int) -> ModelEntry:
    """Re-read ``model``'s config and versions from disk (a version exported after startup counts) and return
    its updated entry; ``ModelNotFound`` if ``version`` is not among them. Blocking: call off the loop."""
    entry = find(entries, model)
    fresh = read_entry(entry.path) if entry.path.is_dir() else replace(entry, available=())
    entries[model] = fresh
    if version not in fresh.available:
        raise ModelNotFound(f"model '{model}' has no version {version} in the repository")
    return fresh
