"""The statistics extension on the Triton backend: Triton's own figures through the gateway (every tritonclient
flavour), counts that match what was sent, the gateway's hop beside them and never inside them, Triton's errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from services.gateway.errors import BackendUnavailable
from services.tritonlocal import LocalTriton, free_port
from tests.gateway_harness import RunningGateway
from tests.statistics_clients import CLIENTS, Endpoint, Figures, raw_statistics, read, read_one, send, settled
from tests.triton.support import gateway_settings, started_backend
from tests.tritonlocal.support import sample

pytestmark = pytest.mark.slow  # a local Triton

REQUESTS, ROWS = 4, 3


def endpoint(gateway: RunningGateway) -> Endpoint:
    return Endpoint(gateway.http_url, gateway.grpc_url)


def triton_figures(server: LocalTriton, model: str, version: str) -> Figures:
    """What Triton itself answers, asked directly."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answer = client.get_inference_statistics(model, version, as_json=False)
    return Figures.from_message(answer.model_stats[0])


@pytest.mark.parametrize("kind", CLIENTS)
async def test_statistics_are_tritons_and_match_what_was_sent_when_forwarded(
    kind: str, gateway: RunningGateway, triton: LocalTriton
) -> None:
    at = endpoint(gateway)
    before = await read_one(kind, at, "mlp", "1")
    sent_ms = time.time_ns() // 1_000_000
    await send(kind, at, "mlp", "1", sample("mlp", ROWS, seed=11), REQUESTS)
    after = await settled(kind, at, "mlp", "1", before.success + REQUESTS)
    assert after.success - before.success == REQUESTS
    assert after.inference_count - before.inference_count == REQUESTS * ROWS
    assert 1 <= after.execution_count - before.execution_count <= REQUESTS
    assert after.queue_ns > before.queue_ns
    assert after.compute_infer_ns > before.compute_infer_ns
    assert after.last_inference >= sent_ms
    direct = triton_figures(triton, "mlp", "1")
    assert (direct.success, direct.inference_count) == (after.success, after.inference_count)  # Triton's, untouched


async def test_statistics_carry_the_gateway_hop_apart_from_tritons_when_read_over_http(
    gateway: RunningGateway,
) -> None:
    at = endpoint(gateway)
    before = raw_statistics(at, "/v2/models/classifier/versions/2/stats").json()["gateway_stats"][0]
    await send("http", at, "classifier", "2", sample("classifier", 2, seed=12), 3)
    body = raw_statistics(at, "/v2/models/classifier/versions/2/stats").json()
    hop = body["gateway_stats"][0]
    assert (hop["name"], hop["version"]) == ("classifier", "2")
    assert hop["success"]["count"] - before["success"]["count"] == 3
    assert hop["backend"]["count"] == hop["success"]["count"]
    assert hop["hop"]["ns"] == hop["success"]["ns"] - hop["backend"]["ns"] > 0
    # Triton's own request time lies inside the gateway's wait on Triton, never added to it.
    triton_success = body["model_stats"][0]["inference_stats"]["success"]
    assert triton_success["count"] >= hop["success"]["count"]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_statistics_list_every_version_triton_serves_when_no_model_is_named(
    kind: str, gateway: RunningGateway
) -> None:
    listed = [(figures.name, figures.version) for figures in await read(kind, endpoint(gateway))]
    assert listed == [("classifier", "1"), ("classifier", "2"), ("mlp", "1"), ("mlp", "2")]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_statistics_answer_not_found_when_triton_has_no_such_model_or_version(
    kind: str, gateway: RunningGateway
) -> None:
    for model, version in (("no-such-model", ""), ("mlp", "7")):
        with pytest.raises(InferenceServerException) as raised:
            await read(kind, endpoint(gateway), model, version)
        assert str(raised.value.status()) in ("404", "StatusCode.NOT_FOUND")


async def test_statistics_answer_503_with_retry_after_when_triton_is_unreachable(repository: Path) -> None:
    settings = gateway_settings(f"127.0.0.1:{free_port()}", repository, triton_control_timeout_s=1.0)
    backend = await started_backend(repository, settings)
    try:
        with pytest.raises(BackendUnavailable) as raised:
            await backend.statistics(None, None)
    finally:
        await backend.close()
    assert raised.value.status == 503
    assert raised.value.retry_after_s is not None
    assert "statistics" in str(raised.value)
