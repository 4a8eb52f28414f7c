"""The standard gRPC health service (``grpc.health.v1.Health``) on the gateway's gRPC port: Check and Watch for the
gateway and its models, the watch limit, NOT_SERVING while the backend is down, and watches ending at shutdown;
the REST health bodies beside it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.settings import Settings
from services.tritonlocal import free_port
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # gateways on real ports

TOKEN = "health-admin-token"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
MAX_WATCHES = 2
WAIT_S = 30.0  # the longest any call here may take: a bound, never a pause


@pytest.fixture(scope="module")
def gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """``mlp`` alone (versions 1 and 2), watches re-read every 50 ms, two watches at most."""
    root = tmp_path_factory.mktemp("health") / "repository"
    shutil.copytree(repository / "mlp", root / "mlp")
    settings = Settings(repository=root, port=0, grpc_port=0, admin_token=TOKEN,  # type: ignore[arg-type]
                        repository_poll_s=0, grpc_health_interval_s=0.05, grpc_health_max_watches=MAX_WATCHES)
    with running_gateway(settings) as running:
        yield running


@pytest.fixture
def health(gateway: RunningGateway) -> Iterator[health_pb2_grpc.HealthStub]:
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        yield health_pb2_grpc.HealthStub(channel)


def check(stub: health_pb2_grpc.HealthStub, service: str) -> int:
    answer: health_pb2.HealthCheckResponse = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=WAIT_S)
    return answer.status


def watch(stub: health_pb2_grpc.HealthStub, service: str) -> grpc.Call:
    call: grpc.Call = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=WAIT_S)
    return call


def test_health_check_answers_serving_when_the_gateway_and_its_model_are_ready(
    health: health_pb2_grpc.HealthStub,
) -> None:
    assert [check(health, name) for name in ("", "inference.GRPCInferenceService", "mlp")] == [SERVING] * 3


def test_health_check_answers_not_found_naming_what_it_knows_when_the_service_is_unknown(
    health: health_pb2_grpc.HealthStub,
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        check(health, "no-such-service")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == (
        "unknown service 'no-such-service': expected '' or 'inference.GRPCInferenceService' (the gateway) "
        "or the name of a model it serves"
    )


def test_health_watch_sends_each_change_when_a_model_is_unloaded_and_loaded_back(
    gateway: RunningGateway, health: health_pb2_grpc.HealthStub
) -> None:
    stream = watch(health, "mlp")
    try:
        assert next(stream).status == SERVING  # type: ignore[call-overload]
        _repository(gateway, "unload")
        assert next(stream).status == NOT_SERVING  # type: ignore[call-overload]
        assert check(health, "") == SERVING  # a model unloaded on purpose leaves the gateway ready
        _repository(gateway, "load")
        assert next(stream).status == SERVING  # type: ignore[call-overload]
    finally:
        stream.cancel()


def test_health_watch_sends_service_unknown_without_ending_when_the_service_is_unknown(
    health: health_pb2_grpc.HealthStub,
) -> None:
    stream = watch(health, "no-such-service")
    try:
        assert next(stream).status == SERVICE_UNKNOWN  # type: ignore[call-overload]
        assert stream.is_active()  # type: ignore[attr-defined]
    finally:
        stream.cancel()


def test_health_watch_is_refused_past_the_limit_and_a_slot_frees_when_a_watcher_leaves(
    health: health_pb2_grpc.HealthStub,
) -> None:
    held = [_first_watch(health) for _ in range(MAX_WATCHES)]
    try:
        with pytest.raises(grpc.RpcError) as refused:
            next(watch(health, ""))  # type: ignore[call-overload]
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "SWITCHYARD_GRPC_HEALTH_MAX_WATCHES" in (refused.value.details() or "")
        held.pop().cancel()  # the server's stream task ends and gives its slot back
        held.append(_first_watch(health))
    finally:
        for stream in held:
            stream.cancel()


def test_health_answers_not_serving_and_watches_end_at_shutdown_when_the_backend_is_down(repository: Path) -> None:
    """A gateway in front of a Triton that does not answer: live, not ready; its watches end (OK) as it stops,
    long before the 30 s grace period a stream left open would hold the stop for."""
    settings = Settings(repository=repository, backend="triton", triton_url=f"127.0.0.1:{free_port()}",
                        port=0, grpc_port=0, grpc_shutdown_grace_s=30.0, grpc_health_interval_s=0.05)
    with running_gateway(settings) as down:
        channel = grpc.insecure_channel(down.grpc_url)  # closed after the gateway: the stream must see it stop
        stub = health_pb2_grpc.HealthStub(channel)
        base = f"http://{down.http_url}"
        assert [check(stub, name) for name in ("", "inference.GRPCInferenceService", "mlp")] == [NOT_SERVING] * 3
        assert (httpx.get(f"{base}/v2/health/live").json(), httpx.get(f"{base}/v2/health/ready").json()) == (
            {"live": True}, {"ready": False}
        )
        not_ready = httpx.get(f"{base}/v2/models/mlp/ready")
        assert not_ready.status_code == 503
        assert not_ready.json() == {"name": "mlp", "ready": False, "error": not_ready.json()["error"]}
        assert not_ready.json()["error"]  # why: the model's own reason
        stream = watch(stub, "")
        assert next(stream).status == NOT_SERVING  # type: ignore[call-overload]
        stopping = time.monotonic()
    stopped_s = time.monotonic() - stopping
    try:
        assert list(stream) == []  # type: ignore[call-overload]  # nothing after NOT_SERVING, already sent
        assert stream.code() == grpc.StatusCode.OK  # type: ignore[attr-defined]
    finally:
        channel.close()
    assert stopped_s < 10.0, f"the gateway took {stopped_s:.1f} s to stop with a health watch open"


def _first_watch(stub: health_pb2_grpc.HealthStub) -> grpc.Call:
    """A watch that has sent its first message; retried while a slot a former watcher left is being freed."""
    deadline = time.monotonic() + WAIT_S
    while True:
        stream = watch(stub, "")
        try:
            assert next(stream).status == SERVING  # type: ignore[call-overload]
            return stream
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
        time.sleep(0.05)  # between tries of a bounded wait


def _repository(gateway: RunningGateway, action: str) -> None:
    response = httpx.post(f"http://{gateway.http_url}/v2/repository/models/mlp/{action}",
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=WAIT_S)
    assert response.status_code == 200, response.text
