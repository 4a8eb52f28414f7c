"""The tuning routes are admin routes: a token is required, a wrong one refused, and bad options answered 400
before anything runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

from services.gateway.app import create_app
from tests.tuning_support import HEADERS, admin_settings, copy_models

pytestmark = pytest.mark.slow  # serves the examples' export


@pytest.fixture
async def client(example_repository: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    models = copy_models(example_repository, tmp_path / "repository", "mlp")
    app = create_app(admin_settings(models, grpc_port=None, state_path=tmp_path / "state.json"))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


async def test_tune_route_answers_401_when_no_token_is_sent(client: httpx.AsyncClient) -> None:
    assert (await client.post("/admin/models/mlp/tune", json={"p99_ms": 10})).status_code == 401
    assert (await client.get("/admin/models/mlp/tune")).status_code == 401
    assert (await client.delete("/admin/models/mlp/tune")).status_code == 401


async def test_tune_route_answers_403_when_token_is_wrong(client: httpx.AsyncClient) -> None:
    wrong = {"Authorization": "Bearer nope"}
    assert (await client.post("/admin/models/mlp/tune", json={"p99_ms": 10}, headers=wrong)).status_code == 403
    assert (await client.delete("/admin/models/mlp/tune", headers=wrong)).status_code == 403


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({}, "p99_ms"),
        ({"p99_ms": 10, "concurrency": [8, 1]}, "ascending"),
        ({"p99_ms": 10, "concurrency": [100000]}, "concurrency"),
        ({"p99_ms": 10, "budget_s": 1e9}, "budget_s"),
        ({"p99_ms": 10, "sneaky": 1}, "unknown option 'sneaky'"),
        ({"p99_ms": "fast"}, "p99_ms"),
        ({"p99_ms": 10, "in_place": True}, "in_place needs the Triton backend"),
    ],
)
async def test_tune_route_answers_400_when_options_are_invalid(
    client: httpx.AsyncClient, body: dict[str, object], names: str
) -> None:
    answer = await client.post("/admin/models/mlp/tune", json=body, headers=HEADERS)
    assert answer.status_code == 400, answer.text
    assert names in answer.json()["error"]


async def test_tune_route_answers_404_when_model_is_unknown_or_never_tuned(client: httpx.AsyncClient) -> None:
    assert (await client.post("/admin/models/nope/tune", json={"p99_ms": 10}, headers=HEADERS)).status_code == 404
    never = await client.get("/admin/models/mlp/tune", headers=HEADERS)
    assert never.status_code == 404
    assert "has not been tuned" in never.json()["error"]
    nothing = await client.delete("/admin/models/mlp/tune", headers=HEADERS)
    assert nothing.status_code == 404
    assert nothing.json()["error"] == (
        "model 'mlp' has no tuning run to cancel: it has not been tuned since the gateway started"
    )
    assert (await client.delete("/admin/models/nope/tune", headers=HEADERS)).status_code == 404
