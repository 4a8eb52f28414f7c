"""The model cache on the embedded backend (real onnxruntime sessions): 12 copies of the example mlp, each declaring
10 MiB, under a 45 MiB budget (4 fit). Zipf traffic over all of them fails no request and stays within the budget;
50 simultaneous first requests cause one load; first requests for more models than fit, all at once, are all
served, no load counting on room another was given; a model with a request in flight, or pinned, is never unloaded;
an idle one is unloaded and comes back on demand; one larger than the budget is refused naming both figures; a load
waiting for room does not hold up a version action of the model it waits for."""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MODELS = [f"m{number:02d}" for number in range(12)]
DECLARED_MB = 10
BODY = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}]}


def copies(source: Path, root: Path, names: list[str], declared_mb: float = DECLARED_MB) -> Path:
    """``names`` as copies of the example mlp, each declaring ``declared_mb`` (``switchyard.memory_mb``)."""
    for name in names:
        shutil.copytree(source / "mlp", root / name)
        config = root / name / "config.pbtxt"
        text = config.read_text().replace('name: "mlp"', f'name: "{name}"', 1)
        declared = f'parameters {{ key: "switchyard.memory_mb" value {{ string_value: "{declared_mb}" }} }}\n'
        config.write_text(text + declared)
    return root


@pytest.fixture
def cached(example_repository: Path, tmp_path: Path) -> Iterator[RunningGateway]:
    repository = copies(example_repository, tmp_path / "repository", MODELS)
    copies(example_repository, repository, ["huge"], declared_mb=500)
    settings = Settings(repository=repository, port=0, grpc_port=0, repository_poll_s=0, model_cache_mb=45,
                        pinned_models="m11", model_min_residency_s=0.2, model_idle_unload_s=0)
    with running_gateway(settings) as running:
        yield running


def cache_of(gateway: RunningGateway):  # type: ignore[no-untyped-def]
    return gateway.app.state.dataplane.cache


def test_zipf_traffic_over_more_models_than_fit_fails_no_request_and_stays_within_the_budget(
    cached: RunningGateway,
) -> None:
    cache = cache_of(cached)
    weights = [1 / rank**1.1 for rank in range(1, len(MODELS) + 1)]
    failures: list[str] = []
    counts = {"sent": 0}
    used: list[float] = []
    stop = threading.Event()

    def client(seed: int) -> None:
        pick = random.Random(seed)
        with httpx.Client(base_url=f"http://{cached.http_url}", timeout=30) as http:
            while not stop.is_set():
                model = pick.choices(MODELS, weights)[0]
                answer = http.post(f"/v2/models/{model}/infer", json=BODY)
                counts["sent"] += 1
                if answer.status_code != 200:
                    failures.append(f"{model}: {answer.status_code} {answer.text[:200]}")

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        used.append(cache.used_mb)
        time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(30)

    assert failures == []
    assert max(used) <= 45
    assert "m11" in cache.residents  # pinned: loaded at start, never unloaded
    hits = cached.metric("switchyard_model_cache_requests_total", result="hit")
    misses = cached.metric("switchyard_model_cache_requests_total", result="miss")
    waiting = cached.metric("switchyard_model_cache_requests_total", result="miss_waiting")
    assert hits + misses + waiting == counts["sent"]
    assert misses > 4  # more models were asked for than fit: some were loaded again after being unloaded
    assert cached.metric("switchyard_model_cache_evictions_total", reason="capacity") >= misses - 4


async def test_fifty_simultaneous_first_requests_to_a_cold_model_cause_one_load(cached: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=f"http://{cached.http_url}", timeout=30) as http:
        answers = await asyncio.gather(*(http.post("/v2/models/m03/infer", json=BODY) for _ in range(50)))

    assert [answer.status_code for answer in answers] == [200] * 50
    assert cached.metric("switchyard_model_cache_load_seconds_count", model="m03") == 1
    assert cached.metric("switchyard_model_cache_requests_total", result="miss") == 1


async def test_a_model_with_a_request_in_flight_is_never_unloaded_and_a_pinned_one_never(
    cached: RunningGateway,
) -> None:
    cache, leases = cache_of(cached), cached.app.state.dataplane.leases
    async with httpx.AsyncClient(base_url=f"http://{cached.http_url}", timeout=30) as http:
        assert (await http.post("/v2/models/m00/infer", json=BODY)).status_code == 200
        await cached.on_loop(_acquire(leases, "m00", 2))  # a request in flight on m00, as infer holds it
        time.sleep(0.3)  # past the minimum residency
        for model in MODELS[1:8]:  # seven more models through a budget of four: m00 is the least recently used
            assert (await http.post(f"/v2/models/{model}/infer", json=BODY)).status_code == 200
        kept = set(cache.residents)
        await cached.on_loop(_release(leases, "m00", 2))
        for model in MODELS[8:11]:
            assert (await http.post(f"/v2/models/{model}/infer", json=BODY)).status_code == 200

    assert {"m00", "m11"} <= kept
    assert "m00" not in cache.residents  # its request done, it is the least recently used again: unloaded
    assert cache.view("m00")["unloaded_by"] == "capacity"
    assert "m11" in cache.residents


async def test_a_model_larger_than_the_budget_is_refused_naming_both_figures(cached: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=f"http://{cached.http_url}", timeout=30) as http:
        answer = await http.post("/v2/models/huge/infer", json=BODY)
        ready = await http.get("/v2/health/ready")

    assert answer.status_code == 507
    assert answer.json()["error"] == (
        "model 'huge' version 2 needs 500.0 MiB (declared), more than the whole model cache of 45 MiB "
        "(SWITCHYARD_MODEL_CACHE_MB): raise the budget, or serve it elsewhere"
    )
    assert ready.status_code == 200


def test_an_idle_model_is_unloaded_and_comes_back_on_demand(example_repository: Path, tmp_path: Path) -> None:
    repository = copies(example_repository, tmp_path / "repository", MODELS[:2])
    settings = Settings(repository=repository, port=0, grpc_port=0, repository_poll_s=0, model_cache_mb=45,
                        model_min_residency_s=0, model_idle_unload_s=0.5)
    with running_gateway(settings) as running, httpx.Client(base_url=f"http://{running.http_url}") as http:
        cache = cache_of(running)
        assert http.post("/v2/models/m00/infer", json=BODY).status_code == 200
        assert "m00" in cache.residents
        deadline = time.monotonic() + 5
        while "m00" in cache.residents and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "m00" not in cache.residents
        assert cache.view("m00")["unloaded_by"] == "idle"  # what the admin API and the console show
        assert http.get("/v2/models/m00/ready").status_code == 200  # ready: it loads on its next request
        assert http.post("/v2/models/m00/infer", json=BODY).status_code == 200
        assert running.metric("switchyard_model_cache_evictions_total", reason="idle") == 1
        assert running.metric("switchyard_model_cache_load_seconds_count", model="m00") == 2


async def _acquire(leases, model: str, version: int) -> None:  # type: ignore[no-untyped-def]
    leases.acquire(model, version)


async def _release(leases, model: str, version: int) -> None:  # type: ignore[no-untyped-def]
    leases.release(model, version)


def test_a_canary_and_a_shadow_version_the_cache_unloaded_are_loaded_again_in_the_background(
    example_repository: Path, tmp_path: Path
) -> None:
    """m00 with a canary (version 1 at 50 %) and m01 with a shadow (version 1): both models unloaded to make room,
    then asked again. The request loads the stable version; the canary's and the shadow's versions follow in the
    background, and their traffic resumes."""
    repository = copies(example_repository, tmp_path / "repository", MODELS[:7])
    token = "cache-canary-token"
    settings = Settings(repository=repository, port=0, grpc_port=0, repository_poll_s=0, model_cache_mb=45,
                        admin_token=token)  # type: ignore[arg-type]
    admin = {"Authorization": f"Bearer {token}"}
    with running_gateway(settings) as running, httpx.Client(base_url=f"http://{running.http_url}", timeout=30) as http:
        cache = cache_of(running)
        assert http.put("/admin/models/m00/traffic", json={"canary": 1, "weight": 50}, headers=admin).is_success
        assert http.put("/admin/models/m01/shadow", json={"version": 1, "percent": 100}, headers=admin).is_success
        for model in MODELS[2:7]:  # five more models through a budget of four (m00 and m01 hold two versions each)
            assert http.post(f"/v2/models/{model}/infer", json=BODY).status_code == 200
        assert "m00" not in cache.residents
        assert "m01" not in cache.residents

        versions: set[str] = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (versions != {"1", "2"} or loaded(cache, "m01") != [1, 2]):
            answer = http.post("/v2/models/m00/infer", json=BODY)
            assert answer.status_code == 200, answer.text
            versions.add(answer.headers["x-model-version"])
            assert http.post("/v2/models/m01/infer", json=BODY).status_code == 200
            time.sleep(0.02)

    assert versions == {"1", "2"}  # the canary serves its share again
    assert loaded(cache, "m00") == [1, 2]
    assert loaded(cache, "m01") == [1, 2]  # the shadow's version is back for its copies


def loaded(cache, model: str) -> list[int]:  # type: ignore[no-untyped-def]
    resident = cache.residents.get(model)
    return sorted(resident.costs) if resident is not None else []


class LoadStarts:
    """The backend's own load, spied on (each load still runs): at each start, the memory the cache counts as loaded
    plus what every load under way expects to need, which must stay within the budget."""

    def __init__(self, cache, backend) -> None:  # type: ignore[no-untyped-def]
        self.cache, self.backend, self.load = cache, backend, backend.load
        self.under_way: dict[tuple[str, int], float] = {}
        self.held: list[float] = []

    async def spy(self, model: str, version: int) -> None:
        self.under_way[model, version] = self.cache.expected(model, version).mb
        self.held.append(self.cache.used_mb + sum(self.under_way.values()))
        try:
            await self.load(model, version)
        finally:
            del self.under_way[model, version]


async def test_simultaneous_first_requests_for_more_models_than_fit_are_all_served_within_the_budget(
    cached: RunningGateway,
) -> None:
    """Eight cold models asked for at once, 80 MiB where 35 are free beside the pinned m11: no two loads count on
    the same free room, and every request is answered, those that waited for room too."""
    cache = cache_of(cached)
    starts = LoadStarts(cache, cached.app.state.manager.backend.inner)
    cached.app.state.manager.backend.inner.load = starts.spy
    async with httpx.AsyncClient(base_url=f"http://{cached.http_url}", timeout=60) as http:
        answers = await asyncio.gather(*(http.post(f"/v2/models/{model}/infer", json=BODY) for model in MODELS[:8]))

    assert [answer.status_code for answer in answers] == [200] * 8, [answer.text[:200] for answer in answers]
    assert len(starts.held) == 8
    assert max(starts.held) <= 45
    assert cached.metric("switchyard_model_cache_evictions_total", reason="capacity") >= 8 - 3


def test_a_load_waiting_for_room_does_not_hold_up_a_version_action_on_the_model_it_waits_for(
    example_repository: Path, tmp_path: Path
) -> None:
    """big (20 MiB) waits for m00's room while a request is in flight on m00; an activation of m00's version 1
    (10 MiB, which fits) loads it meanwhile instead of queueing behind big, whose wait it would prolong by holding
    m00 (a model under a version action is never unloaded): once m00's request ends the activation ends, and big
    unloads m00 and loads."""
    repository = copies(example_repository, tmp_path / "repository", ["m00", "m01"])
    copies(example_repository, repository, ["big"], declared_mb=20)
    token = "cache-room-token"
    settings = Settings(repository=repository, port=0, grpc_port=0, repository_poll_s=0, model_cache_mb=45,
                        pinned_models="m01", admin_token=token)  # type: ignore[arg-type]
    admin = {"Authorization": f"Bearer {token}"}
    with running_gateway(settings) as running, httpx.Client(base_url=f"http://{running.http_url}", timeout=30) as http:
        cache, leases = cache_of(running), running.app.state.dataplane.leases
        assert http.post("/v2/models/m00/infer", json=BODY).status_code == 200
        asyncio.run(running.on_loop(_acquire(leases, "m00", 2)))  # a request in flight on m00
        with ThreadPoolExecutor(2) as pool:
            big = pool.submit(http.post, "/v2/models/big/infer", json=BODY, headers={"X-Request-Timeout": "20000"})
            waiting = wait_until(lambda: load_stage(cache, "big", 2) == "room")
            activation = pool.submit(http.post, "/admin/models/m00/versions/1/activate", headers=admin)
            loaded_meanwhile = wait_until(lambda: loaded(cache, "m00") == [1, 2], timeout_s=10)
            asyncio.run(running.on_loop(_release(leases, "m00", 2)))
            served = big.result(timeout=30)
            activated = activation.result(timeout=30)

    assert waiting
    assert loaded_meanwhile  # not once big gave up waiting
    assert activated.status_code == 200, activated.text
    assert served.status_code == 200, served.text
    assert "m00" not in cache.residents
    assert set(cache.residents) == {"m01", "big"}


def load_stage(cache, model: str, version: int) -> str | None:  # type: ignore[no-untyped-def]
    """How far the cache's load of ``version`` got (queued, room, loading), None when none is under way."""
    demand = cache._loading.get((model, version))
    return None if demand is None else demand.stage
