"""The REST front end and dataplane over a scripted backend: routing, versions, errors, deadlines."""

from __future__ import annotations

import json

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.errors import InferenceFailed, Overloaded
from services.gateway.settings import Settings
from services.gateway.tensors.types import VersionState

X = {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6, 7, 8]}


async def test_lifespan_starts_and_closes_backend_when_app_runs(backend: ScriptedBackend, settings: Settings) -> None:
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app):
        assert backend.started
    assert not backend.started


async def test_infer_returns_json_outputs_when_binary_not_requested(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/double/infer", json={"id": "a", "inputs": [X]})
    assert response.status_code == 200
    assert response.headers["x-model-version"] == "1"
    assert response.json() == {
        "model_name": "double",
        "model_version": "1",
        "id": "a",
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [2, 4], "data": [2, 4, 6, 8, 10, 12, 14, 16]},
            {"name": "z", "datatype": "FP32", "shape": [2, 4], "data": [-1, -2, -3, -4, -5, -6, -7, -8]},
        ],
    }


async def test_infer_mixes_binary_and_json_outputs_when_requested_per_output(client: httpx.AsyncClient) -> None:
    body = {
        "inputs": [X],
        "outputs": [{"name": "z", "parameters": {"binary_data": True}}, {"name": "y"}],
    }
    response = await client.post("/v2/models/double/infer", json=body)
    length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:length])
    assert [o["name"] for o in header["outputs"]] == ["z", "y"]
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 32}
    assert header["outputs"][1]["data"][0] == 2
    assert response.content[length:] == (-__import__("numpy").arange(1, 9, dtype="float32")).tobytes()


async def test_infer_routes_to_the_stable_version_when_unversioned(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    # Loading a version is not activating it: unversioned requests stay on the stable one (version 1 here).
    backend.states.update({2: VersionState.READY, 3: VersionState.LOADING})
    response = await client.post("/v2/models/double/infer", json={"inputs": [X]})
    assert response.json()["model_version"] == "1"
    pinned = await client.post("/v2/models/double/versions/2/infer", json={"inputs": [X]})
    assert pinned.json()["model_version"] == "2"
    metadata = (await client.get("/v2/models/double")).json()
    assert metadata["versions"] == ["1", "2"]


async def test_infer_answers_503_when_version_not_ready(client: httpx.AsyncClient, backend: ScriptedBackend) -> None:
    backend.states[1] = VersionState.LOADING
    response = await client.post("/v2/models/double/versions/1/infer", json={"inputs": [X]})
    assert response.status_code == 503
    not_ready = "Request for unknown model: 'double' version 1 is not at ready state; loading"
    assert response.json() == {"error": not_ready}
    unversioned = await client.post("/v2/models/double/infer", json={"inputs": [X]})
    assert unversioned.status_code == 503
    assert unversioned.json() == {"error": not_ready}
    assert (await client.get("/v2/models/double/ready")).status_code == 503
    assert (await client.get("/v2/health/ready")).status_code == 503


async def test_infer_answers_504_and_passes_budget_when_deadline_expires(
    client: httpx.AsyncClient, backend: ScriptedBackend, registry: CollectorRegistry
) -> None:
    backend.delay_s = 2.0  # far past the deadline
    body = {"inputs": [X], "parameters": {"timeout": 200_000, "priority": 2}}
    response = await client.post("/v2/models/double/infer", json=body)
    assert response.status_code == 504
    assert response.json() == {"error": "request to model 'double': its 200.0 ms deadline passed before it finished"}
    [(version, budget_s, priority)] = backend.calls
    assert (version, priority) == (1, 2)
    assert 0 < budget_s <= 0.2  # what is left of the 200 ms once the gateway has validated the request
    assert registry.get_sample_value("switchyard_rejected_total", {"model": "double", "reason": "deadline"}) == 1


async def test_infer_answers_backend_status_when_backend_fails(
    client: httpx.AsyncClient, backend: ScriptedBackend, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    backend.failure = InferenceFailed("inference failed: boom at /srv/secret/path")
    response = await client.post("/v2/models/double/infer", json={"inputs": [X]})
    request_id = response.headers["x-request-id"]
    assert (response.status_code, response.json()) == (500, {"error": (
        f"inference failed on model 'double' version 1; the gateway log has the cause (request id {request_id})"
    )})
    assert any(request_id in r.getMessage() and "boom at /srv/secret/path" in r.getMessage() for r in caplog.records)
    labels500 = {"model": "double", "version": "1", "protocol": "http", "code": "500"}
    assert registry.get_sample_value("switchyard_requests_total", labels500) == 1
    backend.failure = Overloaded("queue is full (4 requests waiting)")
    response = await client.post("/v2/models/double/infer", json={"inputs": [X]})
    assert (response.status_code, response.json()) == (503, {"error": "queue is full (4 requests waiting)"})
    labels = {"model": "double", "version": "1", "protocol": "http", "code": "503"}
    assert registry.get_sample_value("switchyard_requests_total", labels) == 1
    assert registry.get_sample_value("switchyard_rejected_total", {"model": "double", "reason": "overload"}) == 1


async def test_infer_answers_500_without_internals_when_backend_crashes(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.failure = RuntimeError("secret internal detail")
    response = await client.post("/v2/models/double/infer", json={"inputs": [X]})
    assert response.status_code == 500
    assert response.json() == {"error": f"internal server error (request id {response.headers['x-request-id']})"}


async def test_infer_answers_413_when_body_exceeds_limit(
    client: httpx.AsyncClient, registry: CollectorRegistry
) -> None:
    response = await client.post("/v2/models/double/infer", content=b"{" + b" " * 5000 + b"}")
    assert response.status_code == 413
    assert response.json() == {"error": "request body of 5002 bytes exceeds the 4096 byte limit"}
    assert registry.get_sample_value("switchyard_rejected_total", {"model": "double", "reason": "too_large"}) == 1


async def test_server_endpoints_answer_when_backend_live(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/health/live")).status_code == 200
    assert (await client.get("/v2/health/ready")).status_code == 200
    server = (await client.get("/v2")).json()
    assert server["extensions"] == [
        "binary_tensor_data", "classification", "model_configuration", "model_repository", "statistics"
    ]
    assert "grpc_port" not in server  # gRPC is off here: nothing to advertise
    config = (await client.get("/v2/models/double/versions/1/config")).json()
    assert (config["name"], config["max_batch_size"]) == ("double", 8)
    metadata = (await client.get("/v2/models/double/versions/1")).json()
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert "switchyard_active_version" in (await client.get("/metrics")).text
