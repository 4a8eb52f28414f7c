"""Unit-test fixtures: the real app over a scripted backend and a repository folder for it, driven through its
lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend, double_repository

from services.gateway.app import create_app
from services.gateway.settings import Settings


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """``double`` with versions 1 and 2 on disk (policy ``all``); the routing state in ``tmp_path``."""
    return Settings(
        repository=double_repository(tmp_path / "repository"),
        state_path=tmp_path / "state" / "routing.json",
        grpc_port=None,
        max_body_bytes=4096,
        repository_poll_s=0,
        admin_token="s3cret-admin-token",  # type: ignore[arg-type]
    )


@pytest.fixture
async def client(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, backend=backend, registry=registry)
    async with LifespanManager(app) as manager:
        backend.calls.clear()  # the startup warm-up's requests
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http
