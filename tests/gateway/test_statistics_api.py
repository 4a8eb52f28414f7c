"""The statistics extension's counters (Triton's counting rules), its JSON (Triton's, numbers and zeros included),
and its REST routes over a scripted backend: route order, errors, the gateway's hop, metadata protection."""

from __future__ import annotations

import httpx
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.batching.batcher import ExecutedBatch
from services.gateway.errors import InferenceFailed
from services.gateway.rest.messages import message_json
from services.gateway.settings import Settings
from services.gateway.statistics import Hops, VersionStatistics
from services.gateway.tensors.types import VersionState

X = {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6, 7, 8]}


def test_version_statistics_count_like_triton_when_two_requests_share_a_batch() -> None:
    stats = VersionStatistics()
    stats.executed(ExecutedBatch(rows=4, waits=[0.001, 0.003], merge_s=1e-6, execute_s=0.010, split_s=2e-6))
    stats.succeeded(1, 0.012)
    stats.succeeded(3, 0.014)
    stats.failed(0.5)
    message = stats.message("mlp", 2)
    assert (message.name, message.version) == ("mlp", "2")
    assert (message.inference_count, message.execution_count) == (4, 1)  # rows, batches
    inference = message.inference_stats
    assert (inference.success.count, inference.success.ns) == (2, 26_000_000)
    assert (inference.fail.count, inference.fail.ns) == (1, 500_000_000)
    assert (inference.queue.count, inference.queue.ns) == (2, 4_000_000)
    assert (inference.compute_infer.count, inference.compute_infer.ns) == (2, 20_000_000)  # the batch's time each
    assert [(b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in message.batch_stats] == [
        (4, 1, 10_000_000)
    ]
    assert message.last_inference > 0


def test_message_json_writes_numbers_and_zeros_when_triton_would() -> None:
    stats = VersionStatistics().message("mlp", 1)
    stats.memory_usage.add(type="CPU", id=0, byte_size=2**40)
    found = message_json(stats)
    assert found["inference_stats"]["fail"] == {"count": 0, "ns": 0}
    assert found["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}
    assert found["memory_usage"] == [{"type": "CPU", "id": 0, "byte_size": 2**40}]
    assert found["batch_stats"] == []
    assert found["response_stats"] == {}
    assert found["last_inference"] == 0
    assert isinstance(found["inference_count"], int)


def test_hops_forget_a_version_when_it_is_no_longer_loaded() -> None:
    hops = Hops()
    hops.served("mlp", 1, 0.005, 0.002)
    hops.failed("mlp", 2, 0.001)
    assert hops.json("mlp", 1)["hop"] == {"count": 1, "ns": 3_000_000}
    hops.prune({"mlp": {2: VersionState.READY}})
    assert hops.json("mlp", 1)["success"] == {"count": 0, "ns": 0}
    assert hops.json("mlp", 2)["fail"]["count"] == 1


async def test_statistics_route_answers_every_model_when_the_path_is_v2_models_stats(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/v2/models/stats")  # not the metadata of a model named "stats"
    assert answer.status_code == 200
    body = answer.json()
    assert [(s["name"], s["version"]) for s in body["model_stats"]] == [("double", "1")]
    assert [(s["name"], s["version"]) for s in body["gateway_stats"]] == [("double", "1")]


async def test_statistics_count_the_gateway_hop_when_requests_are_served(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    for _ in range(3):
        assert (await client.post("/v2/models/double/infer", json={"inputs": [X]})).status_code == 200
    backend.failure = InferenceFailed("the model broke")
    assert (await client.post("/v2/models/double/infer", json={"inputs": [X]})).status_code == 500
    bad = {"inputs": [{**X, "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]}
    assert (await client.post("/v2/models/double/infer", json=bad)).status_code == 400
    body = (await client.get("/v2/models/double/versions/1/stats")).json()
    assert body["model_stats"][0]["execution_count"] == 4  # the scripted backend's own count of its calls
    hop = body["gateway_stats"][0]
    assert hop["success"]["count"] == hop["backend"]["count"] == 3
    assert hop["fail"]["count"] == 2  # the gateway's view: every answer for the version, invalid ones included
    assert hop["hop"]["ns"] == hop["success"]["ns"] - hop["backend"]["ns"]


async def test_statistics_answer_404_when_the_model_or_version_is_not_served(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    unknown = await client.get("/v2/models/nope/stats")
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["error"]
    assert (await client.get("/v2/models/double/versions/2/stats")).status_code == 404
    backend.states[1] = VersionState.LOADING
    assert (await client.get("/v2/models/double/stats")).status_code == 404
    assert (await client.get("/v2/models/stats")).json()["model_stats"] == []


async def test_statistics_answer_400_when_the_version_is_malformed(client: httpx.AsyncClient) -> None:
    answer = await client.get("/v2/models/double/versions/1x/stats")
    assert answer.status_code == 400
    assert "1x" in answer.json()["error"]


async def test_statistics_need_the_api_key_when_metadata_is_protected(
    backend: ScriptedBackend, settings: Settings
) -> None:
    protected = settings.model_copy(update={"api_keys": SecretStr("k-123:acme"), "protect_metadata": True})
    app = create_app(protected, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            assert (await http.get("/v2/models/stats")).status_code == 401
            answer = await http.get("/v2/models/double/stats", headers={"X-API-Key": "k-123"})
            assert answer.status_code == 200
