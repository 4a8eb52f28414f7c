"""The states the admin API shows of a loaded version beside the backend's: WARMING while its warm-up runs (pinned
requests get 503 "warming up" then, so READY would mislead), READY once it serves."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from scripted_backend import ScriptedBackend

from tests.waiting import wait_until_async

AUTH = {"Authorization": "Bearer s3cret-admin-token"}


async def states(client: httpx.AsyncClient) -> dict[int, str]:
    answer = await client.get("/admin/models/double", headers=AUTH)
    assert answer.status_code == 200, answer.text
    return {row["version"]: row["state"] for row in answer.json()["loaded"]}


async def overview_loaded(client: httpx.AsyncClient) -> list[Any]:
    answer = await client.get("/admin/models", headers=AUTH)
    return [m["loaded"] for m in answer.json()["models"] if m["name"] == "double"][0]


async def test_a_version_warming_up_is_shown_warming_and_not_as_serving(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    if 2 in await states(client):
        assert (await client.post("/admin/models/double/versions/2/unload", headers=AUTH)).status_code == 200
    backend.hold = asyncio.Event()  # the warm-up's requests wait in the backend
    load = asyncio.create_task(client.post("/admin/models/double/versions/2/load", headers=AUTH))
    try:
        assert await wait_until_async(lambda: len(backend.calls) >= 1)
        assert (await states(client))[2] == "WARMING"
        assert 2 not in await overview_loaded(client)
        pinned = await client.post(
            "/v2/models/double/versions/2/infer",
            json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]},
        )
        assert pinned.status_code == 503  # what WARMING tells
        assert "warming up" in pinned.json()["error"]
    finally:
        backend.hold.set()
    assert (await load).status_code == 200
    assert (await states(client))[2] == "READY"
    assert 2 in await overview_loaded(client)
