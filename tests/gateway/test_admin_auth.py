"""Admin API access: 401 without a token, 403 with a wrong one or when the API is off; the token never shows up
in logs, audit events or error bodies, and admin calls are not counted as inference."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.settings import Settings

TOKEN = "s3cret-admin-token"


async def test_admin_answers_401_with_a_challenge_when_no_bearer_token_is_sent(client: httpx.AsyncClient) -> None:
    for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer "}):
        response = await client.get("/admin/models", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in response.json()["error"]


async def test_admin_answers_403_when_the_token_is_wrong(client: httpx.AsyncClient) -> None:
    for wrong in (TOKEN[:-1], TOKEN + "x", TOKEN.upper()):
        response = await client.get("/admin/models", headers={"Authorization": f"Bearer {wrong}"})
        assert (response.status_code, response.json()) == (403, {"error": "the admin token is not valid"})


async def test_admin_answers_403_saying_how_to_enable_it_when_no_token_is_configured(
    backend: ScriptedBackend, settings: Settings
) -> None:
    app = create_app(settings.model_copy(update={"admin_token": None}), backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://g"
    ) as http:
        response = await http.post("/admin/models/double/rollback", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 403
    assert "SWITCHYARD_ADMIN_TOKEN" in response.json()["error"]


async def test_admin_token_appears_nowhere_when_calls_succeed_and_fail(
    client: httpx.AsyncClient, settings: Settings, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    bodies = []
    with caplog.at_level(logging.DEBUG):
        for method, path in [
            ("GET", "/admin/models"),
            ("GET", "/admin/models/double"),
            ("POST", "/admin/models/double/versions/2/activate"),
            ("POST", "/admin/models/double/versions/9/activate"),
            ("POST", "/admin/models/double/versions/1/unload"),
            ("POST", "/admin/models/double/rollback"),
            ("GET", "/admin/models/double/events"),
            ("POST", "/admin/repository/scan"),
        ]:
            bodies.append((await client.request(method, path, headers=headers)).text)
        bodies.append((await client.get("/admin/models", headers={"Authorization": f"Bearer {TOKEN}x"})).text)
    state_dir = Path(settings.state_path).parent  # type: ignore[arg-type]
    stored = "".join(path.read_text() for path in state_dir.iterdir() if path.is_file())
    assert "token:" in bodies[6]  # events name the caller by fingerprint
    for text in [*bodies, caplog.text, stored]:
        assert TOKEN not in text
    # Admin calls are not inference: no request series for them.
    assert registry.get_sample_value("switchyard_requests_total", {"model": "double", "version": "2",
                                                                   "protocol": "http", "code": "200"}) is None
