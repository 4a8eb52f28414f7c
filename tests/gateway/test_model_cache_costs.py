"""What the model cache counts a load at. Measured: the growth of the load alone, after its runtime started (torch's
import is no model's). Where nothing can be measured (a Triton on another host): the declaration,
else the size of the version's files, said as an estimate; a malformed declaration is refused naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from scripted_backend import CONFIG, ScriptedBackend, double_repository

from services.gateway.backends.priming import IDENTITY_ONNX, prime_runtime
from services.gateway.capacity.backend import CachedBackend
from services.gateway.capacity.cache import ModelCache
from services.gateway.capacity.metrics import CacheMetrics
from services.gateway.errors import InvalidInput
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings
from services.modelrepo.layout import ONNX_PLATFORM, TORCHSCRIPT_PLATFORM


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


class RuntimeInTow(ScriptedBackend):
    """Its first load brings its runtime's 200 MiB along (torch's import, say) unless the runtime was started first;
    each load itself grows the process by 2 MiB."""

    def __init__(self, memory: list[float]) -> None:
        super().__init__(states={})
        self.memory = memory
        self.runtime_started = False

    async def prime_runtime(self, model: str) -> bool:
        if self.runtime_started:
            return False
        self.runtime_started = True
        self.memory[0] += 200
        return True

    async def load(self, model: str, version: int) -> None:
        if not self.runtime_started:
            self.runtime_started = True
            self.memory[0] += 200
        self.memory[0] += 2
        await super().load(model, version)


async def test_a_load_is_measured_after_its_runtime_started_so_it_is_charged_only_its_own_memory(
    tmp_path: Path,
) -> None:
    memory = [500.0]
    catalog = Catalog(double_repository(tmp_path))
    catalog.scan()
    registry = CollectorRegistry()
    settings = Settings(repository=tmp_path, model_cache_mb=100)
    cache = ModelCache(settings, catalog, GatewayMetrics(registry), CacheMetrics(registry), measure=lambda: memory[0])
    backend = CachedBackend(RuntimeInTow(memory), cache)

    await backend.load("double", 2)  # 202 MiB grown in all: more than the budget, were the runtime charged to it

    assert (cache.view("double")["memory_mb"], cache.view("double")["memory_is"]) == (2.0, "measured")


@pytest.mark.slow  # traces a TorchScript module (priming torch)
def test_the_runtimes_start_once_per_process_on_a_model_of_their_own() -> None:
    onnx = pytest.importorskip("onnx")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "prime",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], producer_name="")
    model.ir_version = 7
    assert model.SerializeToString() == IDENTITY_ONNX

    prime_runtime(ONNX_PLATFORM)  # started now, or by an earlier test of this process (on the CPU: the default)
    assert prime_runtime(ONNX_PLATFORM) is False  # never twice
    assert prime_runtime("tensorrt_plan") is False  # not a runtime of the embedded backend
    prime_runtime(TORCHSCRIPT_PLATFORM)
    assert prime_runtime(TORCHSCRIPT_PLATFORM) is False
