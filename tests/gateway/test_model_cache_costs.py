"""What the model cache counts a load at where nothing can be measured (a Triton on another host): the declaration,
else the size of the version's files, said as an estimate; a malformed declaration is refused naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from scripted_backend import CONFIG, ScriptedBackend, double_repository

from services.gateway.capacity.backend import CachedBackend
from services.gateway.capacity.cache import ModelCache
from services.gateway.capacity.metrics import CacheMetrics
from services.gateway.errors import InvalidInput
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings


def cached_backend(repository: Path) -> tuple[CachedBackend, ModelCache]:
    catalog = Catalog(repository)
    catalog.scan()
    registry = CollectorRegistry()
    settings = Settings(repository=repository, model_cache_mb=100)
    cache = ModelCache(settings, catalog, GatewayMetrics(registry), CacheMetrics(registry), measure=lambda: None)
    return CachedBackend(ScriptedBackend(states={}), cache), cache


async def test_without_a_measure_a_load_counts_its_files_as_an_estimate(tmp_path: Path) -> None:
    repository = double_repository(tmp_path)
    (repository / "double" / "2" / "model.onnx").write_bytes(b"\0" * (3 * 2**20))
    backend, cache = cached_backend(repository)

    await backend.load("double", 2)

    assert cache.view("double") == {"resident": True, "memory_mb": 3.0, "memory_is": "estimated", "idle_s": 0.0,
                                    "pinned": False, "unloaded_by": None}


async def test_without_a_measure_a_load_counts_its_declaration(tmp_path: Path) -> None:
    repository = double_repository(tmp_path)
    declared = 'parameters { key: "switchyard.memory_mb" value { string_value: "42.5" } }\n'
    (repository / "double" / "config.pbtxt").write_text(CONFIG + declared)
    backend, cache = cached_backend(repository)

    await backend.load("double", 2)
    await backend.unload("double", 2)

    assert cache.view("double")["memory_mb"] == 42.5
    assert cache.view("double")["memory_is"] == "declared"
    assert cache.view("double")["resident"] is False
    assert cache.reason("double").endswith("(last used 42.5 MiB, declared)")


@pytest.mark.parametrize("value", ["lots", "0", "-3", "inf"])
async def test_a_malformed_declaration_is_refused_naming_the_parameter(tmp_path: Path, value: str) -> None:
    repository = double_repository(tmp_path)
    declared = f'parameters {{ key: "switchyard.memory_mb" value {{ string_value: "{value}" }} }}\n'
    (repository / "double" / "config.pbtxt").write_text(CONFIG + declared)
    backend, _ = cached_backend(repository)

    with pytest.raises(InvalidInput, match="parameter switchyard.memory_mb must be a number of MiB above 0"):
        await backend.load("double", 2)
