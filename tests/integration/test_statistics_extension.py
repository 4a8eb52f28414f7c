"""The statistics extension on the embedded backend, through tritonclient (HTTP, HTTP aio, gRPC, gRPC aio): counts
that match what was sent, every ready version listed, Triton's errors, the gateway's hop, and counters that live and
die with their version."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tritonclient.utils import InferenceServerException

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.statistics_clients import CLIENTS, Endpoint, raw_statistics, read, read_one, send
from tests.tritonlocal.support import sample

pytestmark = pytest.mark.slow  # a gateway on real ports

REQUESTS, ROWS = 5, 3
TOKEN = "statistics-admin-token"


def endpoint(gateway: RunningGateway) -> Endpoint:
    return Endpoint(gateway.http_url, gateway.grpc_url)


def ready_versions(gateway: RunningGateway) -> list[tuple[str, str]]:
    """Every (model, version) the gateway serves, from the v2 metadata of each repository model."""
    found = []
    for model in sorted(gateway.app.state.dataplane.catalog.entries):
        answer = httpx.get(f"http://{gateway.http_url}/v2/models/{model}", timeout=10)
        if answer.status_code == 200:
            found += [(model, version) for version in answer.json()["versions"]]
    return found


@pytest.mark.parametrize("kind", CLIENTS)
async def test_statistics_count_requests_rows_and_batches_when_sent_through_tritonclient(
    kind: str, gateway: RunningGateway
) -> None:
    at = endpoint(gateway)
    before = await read_one(kind, at, "mlp", "1")
    sent_ms = time.time_ns() // 1_000_000
    await send(kind, at, "mlp", "1", sample("mlp", ROWS, seed=3), REQUESTS)
    after = await read_one(kind, at, "mlp", "1")
    assert after.success - before.success == REQUESTS
    assert after.inference_count - before.inference_count == REQUESTS * ROWS
    assert 1 <= after.execution_count - before.execution_count <= REQUESTS
    assert after.batch_executions - before.batch_executions == after.execution_count - before.execution_count
    assert after.fail == before.fail
    assert after.queue_count == after.compute_infer_count == after.success  # as Triton reports them
    assert after.queue_ns > before.queue_ns
    assert after.compute_infer_ns > before.compute_infer_ns
    assert after.last_inference >= sent_ms  # milliseconds since the epoch, of a batch run after sending began


@pytest.mark.parametrize("kind", CLIENTS)
async def test_statistics_list_every_ready_version_when_no_model_is_named(kind: str, gateway: RunningGateway) -> None:
    listed = [(figures.name, figures.version) for figures in await read(kind, endpoint(gateway))]
    assert listed == ready_versions(gateway)
    assert ("mlp", "1") in listed
    assert ("classifier", "2") in listed
    versions = [figures.version for figures in await read(kind, endpoint(gateway), "classifier")]
    assert versions == ["1", "2"]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_statistics_answer_not_found_when_the_model_is_unknown(kind: str, gateway: RunningGateway) -> None:
    with pytest.raises(InferenceServerException) as raised:
        await read(kind, endpoint(gateway), "no-such-model")
    assert str(raised.value.status()) in ("404", "StatusCode.NOT_FOUND")
    assert "no-such-model" in str(raised.value.message())
    with pytest.raises(InferenceServerException) as pinned:
        await read(kind, endpoint(gateway), "mlp", "9")
    assert str(pinned.value.status()) in ("404", "StatusCode.NOT_FOUND")


async def test_statistics_answer_invalid_argument_when_the_version_is_malformed(gateway: RunningGateway) -> None:
    answer = raw_statistics(endpoint(gateway), "/v2/models/mlp/versions/1_0/stats")
    assert answer.status_code == 400
    assert "decimal" in answer.json()["error"]
    with pytest.raises(InferenceServerException) as raised:
        await read("grpc", endpoint(gateway), "mlp", "one")
    assert str(raised.value.status()) == "StatusCode.INVALID_ARGUMENT"


async def test_statistics_leave_the_version_alone_when_a_request_fails_validation(gateway: RunningGateway) -> None:
    at = endpoint(gateway)
    before = await read_one("http", at, "mlp", "2")
    wrong = {"inputs": [{"name": "features", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    answer = httpx.post(f"http://{at.http_url}/v2/models/mlp/versions/2/infer", json=wrong, timeout=10)
    assert answer.status_code == 400
    after = await read_one("http", at, "mlp", "2")
    assert (after.success, after.fail) == (before.success, before.fail)  # as in Triton: it never reached the model


async def test_statistics_report_the_gateway_hop_apart_when_read_over_http(gateway: RunningGateway) -> None:
    at = endpoint(gateway)
    await send("http", at, "classifier", "1", sample("classifier", 2, seed=5), 2)
    body = raw_statistics(at, "/v2/models/classifier/stats").json()
    assert [(s["name"], s["version"]) for s in body["gateway_stats"]] == [
        (s["name"], s["version"]) for s in body["model_stats"]
    ]
    hop = body["gateway_stats"][0]
    assert hop["success"]["count"] >= 2
    assert hop["backend"]["count"] == hop["success"]["count"] == hop["hop"]["count"]
    assert hop["hop"]["ns"] == hop["success"]["ns"] - hop["backend"]["ns"] > 0
    assert set(body["model_stats"][0]["inference_stats"]) == {
        "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"
    }


async def test_server_metadata_names_statistics_when_the_extension_serves(gateway: RunningGateway) -> None:
    answer = httpx.get(f"http://{gateway.http_url}/v2", timeout=10).json()
    assert "statistics" in answer["extensions"]


@pytest.fixture(scope="module")
def admin_gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """A gateway of its own: the test unloads and loads versions."""
    settings = Settings(repository=repository, port=0, grpc_port=0, admin_token=TOKEN)  # type: ignore[arg-type]
    with running_gateway(settings) as running:
        yield running


async def test_statistics_go_away_with_their_version_when_it_is_unloaded_and_start_afresh_when_loaded(
    admin_gateway: RunningGateway,
) -> None:
    at = endpoint(admin_gateway)
    await send("grpc", at, "mlp", "1", sample("mlp", 2, seed=8), 3)
    version_2 = await read_one("grpc", at, "mlp", "2")
    version_1 = await read_one("grpc", at, "mlp", "1")
    admin = httpx.Client(base_url=f"http://{at.http_url}/admin", headers={"Authorization": f"Bearer {TOKEN}"})
    with admin:
        assert admin.post("/models/mlp/versions/1/unload", timeout=60).status_code == 200
        assert ("mlp", "1") not in [(f.name, f.version) for f in await read("http", at)]
        with pytest.raises(InferenceServerException):
            await read("grpc", at, "mlp", "1")
        assert (await read_one("grpc", at, "mlp", "2")).success == version_2.success  # the other keeps its own
        assert admin.post("/models/mlp/versions/1/load", timeout=60).status_code == 200
    reloaded = await read_one("http", at, "mlp", "1")
    # Afresh: only the load's warm-up is counted (the backend ran it, as Triton counts its own), not the 3 requests.
    assert reloaded.success <= version_1.success - 3
    assert reloaded.inference_count <= version_1.inference_count - 6
    hop = raw_statistics(at, "/v2/models/mlp/versions/1/stats").json()["gateway_stats"][0]
    assert hop["success"]["count"] == 0  # the gateway's own figures count the requests clients sent
