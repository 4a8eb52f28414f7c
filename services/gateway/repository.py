"""The gateway's view of a model repository: each model's config, the versions on disk and the ones its
``version_policy`` selects. Any Triton repository works; the exporter's manifest is optional."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from services.gateway.errors import ModelNotFound, unknown_model, unknown_version
from services.gateway.tensors.datatypes import from_config
from services.gateway.tensors.types import ModelMetadata, TensorSpec
from services.modelrepo import layout
from services.modelrepo.config import ConfigError, read_config, select_versions
from services.modelrepo.manifest import is_released


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
    released: tuple[int, ...] = ()
    """The versions of ``available`` a gateway without routing state may make stable by itself
    (``services.modelrepo.manifest.is_released``), ascending."""

    @property
    def selected(self) -> tuple[int, ...]:
        """The versions the config's ``version_policy`` asks to serve."""
        return select_versions(self.config, self.available)

    @property
    def platform(self) -> str:
        return layout.platform(self.config)

    def version_dir(self, version: int) -> Path:
        return self.path / str(version)

    def missing(self, version: int) -> ModelNotFound:
        """The 404 for a version this entry does not have, saying what is on disk: no folder, or a folder without
        the model file the config names (an export copied by hand, half of one). Blocking (a stat): off the loop."""
        folder = self.version_dir(version)
        filename = layout.model_filename(self.config)
        if folder.is_dir() and filename is not None:
            named_by = (
                "config.pbtxt's default_model_filename" if self.config.default_model_filename
                else f"Triton's file name for {self.platform}, as config.pbtxt names no default_model_filename"
            )
            detail = f"its folder {folder} is there but holds no model file: expected {filename} ({named_by})"
        else:
            detail = f"the repository has no version {version} of it"
        return unknown_version(self.name, version, detail)

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
    available = layout.versions(model_dir, config)
    released = tuple(v for v in available if is_released(model_dir / str(v)))
    return ModelEntry(model_dir.name, model_dir, config, available, released=released)


def scan(repository: Path) -> dict[str, ModelEntry]:
    """Every model folder with a ``config.pbtxt``, keyed by model name. Blocking: call off the loop."""
    if not repository.is_dir():
        raise RepositoryError(f"model repository {repository} does not exist")
    return {model_dir.name: read_entry(model_dir) for model_dir in layout.model_dirs(repository)}


def emptiness(repository: Path) -> str | None:
    """Why ``repository`` holds no model, for a warning at start (``None`` when it holds one). Not an error: a fresh
    deployment may fill it later, and the repository poll loads the models that appear. Blocking: call off the
    loop."""
    if not repository.is_dir() or layout.model_dirs(repository):
        return None  # a missing repository is scan()'s error
    if (repository / layout.CONFIG_FILE).is_file():
        return (
            f"model repository {repository} holds a {layout.CONFIG_FILE} itself: it is a model folder, not a "
            f"repository, so no model is served; point SWITCHYARD_REPOSITORY / --repository at its parent, "
            f"{repository.resolve().parent}"
        )
    return (
        f"model repository {repository} holds no model: expected a folder per model, each with a "
        f"{layout.CONFIG_FILE} ({repository}/<model>/{layout.CONFIG_FILE}); nothing is served until one appears "
        f"(the repository poll, SWITCHYARD_REPOSITORY_POLL_S, loads it)"
    )


def find(entries: Mapping[str, ModelEntry], model: str) -> ModelEntry:
    try:
        return entries[model]
    except KeyError:
        raise unknown_model(model) from None


@dataclass(frozen=True)
class ScanResult:
    new_models: tuple[str, ...] = ()
    new_versions: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Versions that appeared on disk for models already known, by model."""
    missing_models: tuple[str, ...] = ()
    """Known models whose folder is gone; their entries are kept (loaded versions keep serving)."""


class Catalog:
    """The gateway's one view of the repository on disk, shared by the backend and the version manager.

    Its methods read files: call them off the event loop (``asyncio.to_thread``). Each replaces whole entries,
    so readers on the loop always see a consistent entry.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._entries: dict[str, ModelEntry] = {}
        self._gone: dict[str, tuple[int, ...]] = {}
        """model -> the versions on disk when its folder was last there, while the folder is missing."""

    @property
    def entries(self) -> Mapping[str, ModelEntry]:
        return self._entries

    def entry(self, model: str) -> ModelEntry:
        """The model's entry as last read; ``ModelNotFound`` for a model the repository never had."""
        return find(self._entries, model)

    def scan(self) -> ScanResult:
        """Re-read every model folder; report what appeared and what disappeared since the last scan."""
        fresh = scan(self.root)
        known = self._entries
        new_models = tuple(sorted(set(fresh) - set(known)))
        # A missing model's entry lists nothing on disk; when its folder comes back, what is new is judged against
        # what it had before it went, not against that empty list (its versions still serve all along).
        before = {name: self._gone.get(name, entry.available) for name, entry in known.items()}
        new_versions = {
            name: tuple(sorted(set(entry.available) - set(before[name])))
            for name, entry in fresh.items()
            if name in known and set(entry.available) - set(before[name])
        }
        missing = tuple(sorted(set(known) - set(fresh)))
        merged = dict(fresh)
        for name in missing:
            merged[name] = replace(known[name], available=(), released=())
        self._gone = {name: before[name] for name in missing}
        self._entries = merged
        return ScanResult(new_models, new_versions, missing)

    def refresh(self, model: str, version: int) -> ModelEntry:
        """Re-read ``model``'s config and versions (a version exported after startup, a re-exported config) and
        return its entry; ``ModelNotFound`` if ``version`` is not on disk."""
        entry = self.entry(model)
        fresh = read_entry(entry.path) if entry.path.is_dir() else replace(entry, available=(), released=())
        self._entries = {**self._entries, model: fresh}
        if version not in fresh.available:
            raise fresh.missing(version)
        return fresh
