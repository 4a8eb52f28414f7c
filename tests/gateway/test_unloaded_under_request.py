"""An unversioned request whose version a switch unloads before the request reaches it (a drain that does not wait:
timeout 0) is told to retry (503, Retry-After), not that a version it never asked for "is not found"."""

from __future__ import annotations

import asyncio

import httpx
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.settings import Settings
from tests.waiting import wait_until_async

AUTH = {"Authorization": "Bearer s3cret-admin-token"}
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


async def test_a_request_queued_for_a_version_a_switch_unloaded_at_once_is_told_to_retry(
    backend: ScriptedBackend, settings: Settings
) -> None:
    app = create_app(settings.model_copy(update={"max_concurrency": 1}), backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://g"
    ) as client:
        stable = (await client.get("/admin/models/double", headers=AUTH)).json()["routing"]["stable"]
        other = 2 if stable == 1 else 1
        if other not in backend.states:
            assert (await client.post(f"/admin/models/double/versions/{other}/load", headers=AUTH)).status_code == 200
        backend.calls.clear()
        backend.hold = asyncio.Event()
        first = asyncio.create_task(client.post("/v2/models/double/infer", json=BODY))  # holds the only slot
        assert await wait_until_async(lambda: len(backend.calls) == 1)
        queued = asyncio.create_task(client.post("/v2/models/double/infer", json=BODY))  # routed, at the gate
        assert await wait_until_async(lambda: app.state.dataplane.leases.count("double", stable) == 2)
        switched = await client.post(
            f"/admin/models/double/versions/{other}/activate", headers=AUTH,
            json={"keep_previous": False, "drain_timeout_s": 0, "compare": False},  # the held backend would stall it
        )
        assert switched.status_code == 200, switched.text
        assert stable not in backend.states  # unloaded with both requests still on it
        backend.hold.set()
        for answer in (await first, await queued):
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            assert f"version {stable}, which this request was routed to, was unloaded" in answer.json()["error"]
        again = await client.post("/v2/models/double/infer", json=BODY)
        assert again.status_code == 200
        assert again.headers["x-model-version"] == str(other)
