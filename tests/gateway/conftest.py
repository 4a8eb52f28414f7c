"""Unit-test fixtures: the real app over a scripted backend, driven through its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend

from services.gateway import Settings, create_app


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def client(backend: ScriptedBackend, registry: CollectorRegistry) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(grpc_port=None, max_body_bytes=4096), backend=backend, registry=registry)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http
