"""Two gateway replicas sharing routing through a real redis-server: a repository unload or load on one is followed
by the other, as an admin switch is (the routing record says the model is unloaded, and which versions stay loaded)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from examples import models
from tests.gateway_process import GatewayProcess, gateway_process
from tests.redis_server import redis_server
from tests.repository_clients import policy
from tests.waiting import wait_until

TOKEN = "repository-replica-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MLP = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32",
                   "data": models.mlp_inputs(1, seed=4).numpy().ravel().tolist()}]}


@pytest.fixture
def replicas(repository: Path, tmp_path: Path) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    root = tmp_path / "repository"
    shutil.copytree(repository / "mlp", root / "mlp")
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp_path / "redis"))
        started = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            started.append(stack.enter_context(gateway_process(root, tmp_path / name, token=TOKEN,
                                                               redis_url=redis.url)))
        yield started[0], started[1]


def _answer(gateway: GatewayProcess) -> tuple[int, str | None]:
    response = httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", json=MLP, timeout=30)
    return response.status_code, response.headers.get("x-model-version")


def _loaded(gateway: GatewayProcess) -> list[int]:
    status = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=AUTH, timeout=10).json()
    return [version["version"] for version in status["loaded"]]


def _eventually(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    assert wait_until(check, timeout_s), f"the other replica did not follow: {what}"


@pytest.mark.slow
def test_repository_unload_and_load_are_followed_when_replicas_share_redis(
    replicas: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = replicas
    assert _answer(b) == (200, "2")
    assert httpx.post(f"http://{a.http_url}/v2/repository/models/mlp/unload", headers=AUTH, timeout=60).is_success
    _eventually(lambda: _answer(b)[0] == 404 and _loaded(b) == [], "unload")
    narrowed = {"parameters": {"config": json.dumps(policy(1))}}
    loaded = httpx.post(f"http://{a.http_url}/v2/repository/models/mlp/load", headers=AUTH, json=narrowed, timeout=60)
    assert loaded.is_success, loaded.text
    _eventually(lambda: _answer(b) == (200, "1") and _loaded(b) == [1], "load of version 1")
    assert httpx.post(f"http://{b.http_url}/v2/repository/models/mlp/load", headers=AUTH, timeout=60).is_success
    _eventually(lambda: _answer(a) == (200, "2") and _loaded(a) == [1, 2], "load back on the other side")
