"""Repository load and unload over a scripted backend, through the REST routes: the transient states the index
shows (UNLOADING while requests drain, LOADING while a version loads), a failed load that changes nothing, one action
per model at a time, and an unload that survives a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.settings import Settings
from services.gateway.tensors.types import VersionState
from tests.waiting import eventually_async, wait_until_async

AUTH = {"Authorization": "Bearer s3cret-admin-token"}
X = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}


@asynccontextmanager
async def serving(settings: Settings, backend: ScriptedBackend) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://g"
    ) as http:
        yield http


async def index(client: httpx.AsyncClient) -> dict[str, tuple[str, str]]:
    answer = await client.post("/v2/repository/index", headers=AUTH)
    assert answer.status_code == 200, answer.text
    return {e["version"]: (e["state"], e.get("reason", "")) for e in answer.json()}


async def call(client: httpx.AsyncClient, action: str, versions: list[int] | None = None) -> httpx.Response:
    body = None
    if versions is not None:
        body = {"parameters": {"config": json.dumps({"version_policy": {"specific": {"versions": versions}}})}}
    return await client.post(f"/v2/repository/models/double/{action}", headers=AUTH, json=body)


async def test_repository_unload_shows_unloading_and_refuses_new_requests_when_one_is_in_flight(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.hold = asyncio.Event()
    in_flight = asyncio.create_task(client.post("/v2/models/double/infer", json={"inputs": [X]}))
    assert await wait_until_async(lambda: len(backend.calls) == 1)  # in the backend, held there
    unload = asyncio.create_task(call(client, "unload"))

    async def version_1() -> tuple[str, str]:
        return (await index(client))["1"]

    assert await eventually_async(version_1, ("UNLOADING", "")) == ("UNLOADING", "")
    refused = await client.post("/v2/models/double/infer", json={"inputs": [X]})
    assert refused.status_code == 404
    assert "unloaded through the repository API" in refused.json()["error"]
    backend.hold.set()
    assert (await in_flight).status_code == 200  # admitted before the unload: served by its version
    report = (await unload).json()
    assert (report["result"], report["drained"], report["unloaded"]) == ("ok", True, [1])
    assert (await index(client))["1"][0] == "UNAVAILABLE"
    assert (await client.get("/v2/health/ready")).status_code == 200  # unloaded on purpose: the gateway is ready


async def test_repository_load_shows_loading_then_ready_when_a_version_takes_time(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.load_hold = asyncio.Event()
    load = asyncio.create_task(call(client, "load", [1, 2]))

    async def version_2() -> str:
        return (await index(client)).get("2", ("", ""))[0]

    assert await eventually_async(version_2, "LOADING") == "LOADING"
    busy = await call(client, "unload")
    assert busy.status_code == 409
    assert "busy" in busy.json()["error"]
    backend.load_hold.set()
    report = (await load).json()
    assert (report["result"], report["versions"]) == ("ok", {"from": 1, "to": 2})
    assert await index(client) == {"1": ("READY", ""), "2": ("READY", "")}


async def test_repository_load_changes_nothing_and_answers_422_when_a_version_fails_to_load(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.broken = {2}
    before = (await client.get("/admin/models/double", headers=AUTH)).json()["routing"]
    failed = await call(client, "load", [2])
    assert failed.status_code == 422
    assert "failed at step 'load'" in failed.json()["error"]
    assert "version 1 keeps serving" in failed.json()["error"]
    assert (await client.get("/admin/models/double", headers=AUTH)).json()["routing"] == before
    assert backend.states[1] is VersionState.READY
    served = await client.post("/v2/models/double/infer", json={"inputs": [X]})
    assert served.headers["x-model-version"] == "1"


async def test_repository_unload_stays_in_force_when_the_gateway_restarts(
    backend: ScriptedBackend, settings: Settings
) -> None:
    async with serving(settings, backend) as client:
        assert (await call(client, "unload")).status_code == 200
    backend.states = {}
    async with serving(settings, backend) as client:
        assert backend.loads == []  # nothing loaded at startup: it was unloaded
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.post("/v2/models/double/infer", json={"inputs": [X]})).status_code == 404
        assert (await call(client, "load")).status_code == 200
        assert (await client.post("/v2/models/double/infer", json={"inputs": [X]})).status_code == 200
