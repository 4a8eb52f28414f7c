"""The model cache as requests meet it, in process over a scripted backend: a load whose requests all gave up goes on
and leaves a model that is unloaded like any other (as idle, to make room); a deadline that passes while the load
waits for room is a 503 with ``Retry-After`` saying so, and the load is given up; a model larger than the budget is
507 over HTTP and ``RESOURCE_EXHAUSTED`` over gRPC; a pinned model the repository lacks is named once; the idle sweep
goes on past a model unloaded meanwhile."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from app_clients import both_protocols
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import CONFIG, ScriptedBackend
from tritonclient.grpc import service_pb2

from services.gateway.app import create_app
from services.gateway.capacity.cache import ModelCache
from services.gateway.settings import Settings
from services.gateway.tensors.types import ModelMetadata, VersionState
from tests.waiting import wait_until_async

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
CACHE_LOG = "services.gateway.capacity.cache"


class Shelf(ScriptedBackend):
    """``ScriptedBackend`` for every model of the repository, each serving as ``double`` does; ``load_hold``, when
    given, keeps every load in state LOADING until it is set."""

    def __init__(self) -> None:
        super().__init__(states={})
        self.shelf: dict[str, dict[int, VersionState]] = {}

    def models(self) -> dict[str, dict[int, VersionState]]:
        return {model: dict(states) for model, states in self.shelf.items()}

    def state(self, model: str, version: int) -> VersionState | None:
        return self.shelf.get(model, {}).get(version)

    async def load(self, model: str, version: int) -> None:
        states = self.shelf.setdefault(model, {})
        states[version] = VersionState.LOADING
        if self.load_hold is not None:
            await self.load_hold.wait()
        states[version] = VersionState.READY

    async def unload(self, model: str, version: int) -> None:
        self.shelf.get(model, {}).pop(version, None)

    async def ready(self, model: str, version: int) -> bool:
        return self.state(model, version) is VersionState.READY

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        return dataclasses.replace(await super().metadata("double", version), name=model)


def repository(root: Path, declared_mb: dict[str, float]) -> Path:
    """A model per name, version 1 only, each declaring its memory (``switchyard.memory_mb``)."""
    for name, mb in declared_mb.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(b"")
        declared = f'parameters {{ key: "switchyard.memory_mb" value {{ string_value: "{mb:g}" }} }}\n'
        (root / name / "config.pbtxt").write_text(CONFIG.replace('name: "double"', f'name: "{name}"') + declared)
    return root


def cache_settings(tmp_path: Path, **changes: object) -> Settings:
    """m1, m2 and m3 of 40 MiB each, and huge of 500 MiB, under a budget of 100 MiB unless ``changes`` say."""
    models = repository(tmp_path / "repository", {"m1": 40, "m2": 40, "m3": 40, "huge": 500})
    settings = Settings(repository=models, state_path=tmp_path / "state" / "routing.json", grpc_port=None,
                        repository_poll_s=0, model_cache_mb=100)
    return settings.model_copy(update=changes)


@asynccontextmanager
async def serving(backend: Shelf, settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, ModelCache]]:
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as http,
    ):
        yield http, app.state.dataplane.cache


def infer(http: httpx.AsyncClient, model: str, timeout_ms: int) -> asyncio.Task[httpx.Response]:
    headers = {"X-Request-Timeout": str(timeout_ms)}
    return asyncio.create_task(http.post(f"/v2/models/{model}/infer", json=BODY, headers=headers))


async def gave_up_on_a_load(
    backend: Shelf, cache: ModelCache, http: httpx.AsyncClient, log: pytest.LogCaptureFixture
) -> None:
    """m1 loaded for a request whose deadline passed while the backend was loading it: 504, the load goes on and
    ends with nobody left to serve."""
    model = "m1"
    log.set_level(logging.INFO, logger=CACHE_LOG)
    backend.load_hold = asyncio.Event()
    late = await infer(http, model, timeout_ms=50)
    assert late.status_code == 504
    assert late.json()["error"] == (
        f"model '{model}' version 1 was not loaded yet when the request's deadline passed (a cold start of the "
        "model cache; it goes on loading)"
    )
    backend.load_hold.set()
    assert await wait_until_async(lambda: "model cache: loaded model 'm1'" in log.text, timeout_s=5)
    assert model in cache.residents  # it went on loading, as the answer said
    backend.load_hold = None


async def test_a_model_whose_requests_gave_up_during_its_load_is_unloaded_to_make_room(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = Shelf()
    async with serving(backend, cache_settings(tmp_path, model_cache_mb=50)) as (http, cache):
        await gave_up_on_a_load(backend, cache, http, caplog)
        answer = await infer(http, "m2", timeout_ms=3000)  # only one of them fits

    assert answer.status_code == 200, answer.text
    assert "m1" not in cache.residents
    assert cache.view("m1")["unloaded_by"] == "capacity"


async def test_a_model_whose_requests_gave_up_during_its_load_is_unloaded_when_idle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = Shelf()
    async with serving(backend, cache_settings(tmp_path, model_idle_unload_s=0.2)) as (http, cache):
        await gave_up_on_a_load(backend, cache, http, caplog)
        assert await wait_until_async(lambda: "m1" not in cache.residents, timeout_s=3)

    assert cache.view("m1")["unloaded_by"] == "idle"


async def test_a_deadline_passing_while_the_load_waits_for_room_is_a_503_with_retry_after_and_the_load_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = Shelf()
    caplog.set_level(logging.INFO, logger=CACHE_LOG)
    async with serving(backend, cache_settings(tmp_path, model_min_residency_s=30)) as (http, cache):
        assert [(await infer(http, model, 3000)).status_code for model in ("m1", "m2")] == [200, 200]
        refused = await infer(http, "m3", timeout_ms=200)  # m1 and m2 stay 30 s: no room for m3 before then
        given_up = await wait_until_async(lambda: "gave up loading model 'm3' version 1" in caplog.text, timeout_s=3)

    assert refused.status_code == 503
    assert refused.json()["error"] == (
        "model 'm3' version 1 could not be loaded: the model cache had no room free for it (40.0 MiB) within the "
        "request's deadline (80 of 100 MiB in use; every loaded model is pinned, serving or loaded less than "
        "SWITCHYARD_MODEL_MIN_RESIDENCY_S (30 s) ago); retry later"
    )
    assert 20 <= int(refused.headers["retry-after"]) <= 30  # when m1, the least recently used, may go
    assert given_up  # not loaded for nobody once its request was told it could not be
    assert set(cache.residents) == {"m1", "m2"}
    assert "m3" not in backend.shelf


async def test_a_model_larger_than_the_budget_is_resource_exhausted_over_grpc_as_507_over_http(
    tmp_path: Path,
) -> None:
    message = service_pb2.ModelInferRequest(model_name="huge")
    message.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    message.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    async with both_protocols(Shelf(), cache_settings(tmp_path)) as (http, stub):
        over_http = await http.post("/v2/models/huge/infer", json=BODY)
        with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
            await stub.ModelInfer(message)

    too_large = ("model 'huge' version 1 needs 500.0 MiB (declared), more than the whole model cache of 100 MiB "
                 "(SWITCHYARD_MODEL_CACHE_MB): raise the budget, or serve it elsewhere")
    assert (over_http.status_code, over_http.json()["error"]) == (507, too_large)
    assert (over_grpc.value.code(), over_grpc.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, too_large)


async def test_a_pinned_model_the_repository_lacks_is_named_once_at_start_and_not_again_on_a_rescan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = cache_settings(tmp_path, pinned_models="nope,m1")
    app = create_app(settings, backend=Shelf(), registry=CollectorRegistry())
    async with LifespanManager(app):
        at_start = [record.getMessage() for record in caplog.records if record.name == CACHE_LOG]
        await app.state.manager.scan()
        after_rescan = [record.getMessage() for record in caplog.records if record.name == CACHE_LOG]

    assert at_start == [
        f"SWITCHYARD_PINNED_MODELS names ['nope'], not in the repository {settings.repository} (pinned if they "
        "appear)"
    ]
    assert after_rescan == at_start
    assert "m1" in app.state.dataplane.cache.residents  # the one spelled right is pinned


async def test_a_pinned_model_that_does_not_fit_beside_the_other_pinned_ones_is_refused_at_once_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Pinned models are never unloaded: waiting for room would end only in a refusal, so it comes at once, naming
    them and what to change."""
    settings = cache_settings(tmp_path, pinned_models="m1,m2,m3")
    app = create_app(settings, backend=Shelf(), registry=CollectorRegistry())
    async with LifespanManager(app, startup_timeout=10):
        resident = set(app.state.dataplane.cache.residents)

    assert resident == {"m1", "m2"}
    logged = [record.getMessage() for record in caplog.records if record.name == CACHE_LOG]
    refusals = [message for message in logged if "did not load at start" in message]
    assert refusals == [
        "model cache: pinned model 'm3' version 1 did not load at start: model 'm3' version 1 needs 40.0 MiB, and the "
        "pinned models ('m1' 40 MiB, 'm2' 40 MiB) hold 80 of the model cache's 100 MiB for good "
        "(SWITCHYARD_PINNED_MODELS): pin fewer models, or raise SWITCHYARD_MODEL_CACHE_MB"
    ]


class SlowUnloads(Shelf):
    """``Shelf`` whose unloads of the models in ``held`` wait for their event (``unloading`` names them meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, asyncio.Event] = {}
        self.unloading: set[str] = set()

    async def unload(self, model: str, version: int) -> None:
        hold = self.held.get(model)
        if hold is not None:
            self.unloading.add(model)
            await hold.wait()
        await super().unload(model, version)


async def test_the_idle_sweep_goes_on_when_a_model_it_was_to_unload_next_was_unloaded_to_make_room_meanwhile(
    tmp_path: Path,
) -> None:
    """m1 and m2 idle: the sweep unloads m1 (slowly), and meanwhile m3's load unloads m2 to make room. The sweep
    skips m2 instead of failing on it, and idle models are still unloaded after (m3 too)."""
    backend = SlowUnloads()
    backend.held["m1"] = release = asyncio.Event()
    async with serving(backend, cache_settings(tmp_path, model_idle_unload_s=0.2)) as (http, cache):
        assert [(await infer(http, model, 3000)).status_code for model in ("m1", "m2")] == [200, 200]
        assert await wait_until_async(lambda: "m1" in backend.unloading, timeout_s=5)  # the sweep unloads m1
        assert (await infer(http, "m3", 3000)).status_code == 200  # m2 unloaded to make room for it
        release.set()
        m3_idle = await wait_until_async(lambda: "m3" not in cache.residents, timeout_s=5)

    assert m3_idle
    assert {model: cache.view(model)["unloaded_by"] for model in ("m1", "m2", "m3")} == {
        "m1": "idle", "m2": "capacity", "m3": "idle"
    }
