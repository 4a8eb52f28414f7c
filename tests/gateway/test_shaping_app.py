"""Request shaping through the app (scripted backend): body size while streaming, API keys, rate limits, deadlines
that never reach the backend, priority shedding, bounded metric labels, keep-alive-safe 500s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.settings import Settings
from tests.waiting import wait_until_async

X = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
BODY = {"inputs": [X]}


@asynccontextmanager
async def shaped_client(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, **changes: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update=changes), backend=backend, registry=registry)
    async with LifespanManager(app) as manager:
        backend.calls.clear()
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


def rejected(registry: CollectorRegistry, reason: str, model: str = "double") -> float:
    return registry.get_sample_value("switchyard_rejected_total", {"model": model, "reason": reason}) or 0.0


def waiting(registry: CollectorRegistry, model: str = "double") -> float:
    """Requests waiting for a concurrency slot of the model (the gateway's own gauge)."""
    return registry.get_sample_value("switchyard_admission_waiting", {"model": model}) or 0.0


async def test_infer_answers_413_when_chunked_body_outgrows_limit(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the size is only known while reading
        for _ in range(100):
            sent.append(1024)
            yield b" " * 1024

    async with shaped_client(backend, registry, settings) as client:
        response = await client.post("/v2/models/double/infer", content=chunks())
    assert response.status_code == 413
    assert response.json()["error"].startswith("request body exceeds the 4096 byte limit")
    assert response.headers["connection"] == "close"
    assert rejected(registry, "too_large") == 1
    assert backend.calls == []


async def test_infer_answers_504_without_backend_call_when_deadline_passes_in_queue(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    async with shaped_client(backend, registry, settings, max_concurrency=1, max_queue=4) as client:
        backend.hold = asyncio.Event()  # after the startup's warm-up
        first = asyncio.create_task(client.post("/v2/models/double/infer", json=BODY))
        assert await wait_until_async(lambda: len(backend.calls) == 1)  # holds the only slot until released
        late = await client.post("/v2/models/double/infer", json=BODY, headers={"X-Request-Timeout": "30"})
        backend.hold.set()
        assert (await first).status_code == 200
    assert late.status_code == 504, late.text
    assert late.json() == {
        "error": "request to model 'double' waited for a free slot until its deadline passed (1 executing, 0 waiting)"
    }
    assert len(backend.calls) == 1  # the late request never reached the backend
    assert rejected(registry, "deadline") == 1


async def test_infer_passes_remaining_budget_when_deadline_comes_from_header(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    async with shaped_client(backend, registry, settings, max_timeout_ms=1000) as client:
        assert (
            await client.post("/v2/models/double/infer", json=BODY, headers={"X-Request-Timeout": "250"})
        ).is_success
        assert (await client.post("/v2/models/double/infer", json=BODY)).is_success  # the default, cut to 1 s
        refused = await client.post("/v2/models/double/infer", json=BODY, headers={"X-Request-Timeout": "soon"})
    (_, header_budget, _), (_, default_budget, _) = backend.calls
    assert header_budget is not None
    assert 0.2 < header_budget <= 0.25
    assert default_budget is not None
    assert 0.9 < default_budget <= 1.0
    assert refused.status_code == 400
    assert "X-Request-Timeout must be a positive number of milliseconds" in refused.json()["error"]


async def test_infer_sheds_lowest_priority_first_when_queue_full(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    async with shaped_client(backend, registry, settings, max_concurrency=1, max_queue=1) as client:
        backend.hold = asyncio.Event()  # after the startup's warm-up

        def post(priority: str) -> asyncio.Task[httpx.Response]:
            return asyncio.create_task(
                client.post("/v2/models/double/infer", json=BODY, headers={"X-Priority": priority})
            )

        running = post("2")
        assert await wait_until_async(lambda: len(backend.calls) == 1)  # holds the only slot until released
        low = post("3")
        assert await wait_until_async(lambda: waiting(registry) == 1)  # low fills the queue
        high = post("1")
        shed = await low
        refused = await post("3")  # as low as the one queued (high): refused at once
        backend.hold.set()
        answers = await asyncio.gather(running, high)
    assert [a.status_code for a in answers] == [200, 200]
    assert (shed.status_code, shed.headers["retry-after"]) == (503, "1")
    assert "a request of higher priority took its place" in shed.json()["error"]
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert [priority for _, _, priority in backend.calls] == [2, 1]
    assert rejected(registry, "overload") == 2


async def test_infer_answers_401_when_api_key_missing_or_unknown(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    keys = SecretStr("k-alpha-123:alpha,k-beta-456:beta")
    async with shaped_client(backend, registry, settings, api_keys=keys) as client:
        missing = await client.post("/v2/models/double/infer", json=BODY)
        unknown = await client.post("/v2/models/double/infer", json=BODY, headers={"X-API-Key": "k-wrong"})
        ok = await client.post("/v2/models/double/infer", json=BODY, headers={"X-API-Key": "k-beta-456"})
        metadata = await client.get("/v2/models/double")  # open unless protect_metadata
    assert [missing.status_code, unknown.status_code, ok.status_code, metadata.status_code] == [401, 401, 200, 200]
    assert "X-API-Key" in missing.json()["error"]
    assert "k-wrong" not in unknown.text
    assert backend.calls == [(1, pytest.approx(60.0, abs=1.0), 2)]
    assert registry.get_sample_value("switchyard_tenant_requests_total", {"tenant": "beta", "code": "200"}) == 1
    assert rejected(registry, "unauthorized") == 2


async def test_metadata_needs_api_key_when_protected(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    async with shaped_client(
        backend, registry, settings, api_keys=SecretStr("k-alpha-123"), protect_metadata=True
    ) as client:
        assert (await client.get("/v2/models/double")).status_code == 401
        assert (await client.get("/v2/models/double/ready")).status_code == 401
        assert (await client.get("/v2/models/double", headers={"X-API-Key": "k-alpha-123"})).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200


async def test_infer_answers_429_with_retry_after_when_bucket_empty(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    async with shaped_client(backend, registry, settings, rate_limit_rps=0.5, rate_limit_burst=2) as client:
        answers = [await client.post("/v2/models/double/infer", json=BODY) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].headers["x-ratelimit-limit"] == "2"
    assert answers[1].headers["x-ratelimit-remaining"] == "0"
    refused = answers[2]
    assert refused.headers["retry-after"] == "2"  # one token every 2 s, rounded up
    assert "rate limit" in refused.json()["error"]
    assert rejected(registry, "rate_limit") == 1
    assert len(backend.calls) == 2


async def test_metrics_stay_bounded_when_clients_invent_models_and_versions(
    client: httpx.AsyncClient, registry: CollectorRegistry
) -> None:
    for i in range(50):
        await client.post(f"/v2/models/made-up-{i}/infer", json=BODY)
        await client.post(f"/v2/models/double/versions/{900 + i}/infer", json=BODY)
        await client.post(f"/v2/models/nul%00%0d%0a{i}/infer", json=BODY)
    series = [s for m in registry.collect() if m.name == "switchyard_requests" for s in m.samples]
    labels = {(s.labels["model"], s.labels["version"]) for s in series}
    assert labels == {("_other", ""), ("double", "_other")}
    assert rejected(registry, "not_found", model="_other") == 100


async def test_infer_keeps_connection_usable_after_internal_error(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    async with shaped_client(backend, registry, settings) as client:
        backend.failure = RuntimeError("a bug")
        crashed = await client.post("/v2/models/double/infer", json=BODY)
    assert crashed.status_code == 500
    assert "connection" not in crashed.headers
    labels = {"model": "double", "version": "1", "protocol": "http", "code": "500"}
    assert registry.get_sample_value("switchyard_requests_total", labels) == 1
