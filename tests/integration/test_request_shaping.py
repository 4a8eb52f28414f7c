"""Request shaping on a real gateway (embedded backend, real onnxruntime) over REST and gRPC: body limits, API keys,
rate limits, deadlines that never reach the backend, priority shedding, and 500s that keep the connection."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
from pydantic import SecretStr
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.shaping_models import busy_inputs, heavy_rows, shaping_repository
from tests.waiting import eventually

pytestmark = pytest.mark.slow
FREE = {"X-API-Key": "k-free-0123"}
LIMITED = {"X-API-Key": "k-limited-4567"}
MAX_BODY = 2 * 1024 * 1024
LIMITS = """
[tenants.limited]
rps = 0.5
burst = 2
"""


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """``heavy`` and ``faulty``; keys for tenants ``free`` and ``limited`` (2 requests, then one per 2 s); one
    request of a model executes at a time and one more may wait."""
    root = tmp_path_factory.mktemp("shaping")
    (root / "limits.toml").write_text(LIMITS)
    settings = Settings(
        repository=shaping_repository(root / "repository"),
        port=0,
        grpc_port=0,
        repository_poll_s=0,
        api_keys=SecretStr("k-free-0123:free,k-limited-4567:limited"),
        limits_file=root / "limits.toml",
        rate_limit_rps=1000.0,
        max_body_bytes=MAX_BODY,
        max_concurrency=1,
        max_queue=1,
        intra_op_threads=1,
    )
    with running_gateway(settings) as running:
        yield running


@pytest.fixture(scope="module")
def web() -> Iterator[httpx.Client]:
    """One pooled client for the module: a new client per call spends tens of ms building its TLS context, long
    enough to blur which request reaches the gateway first."""
    with httpx.Client(timeout=30) as client:
        yield client


def heavy_body(rows: int) -> tuple[bytes, dict[str, str]]:
    """A binary-framed v2 request (JSON header, then the tensor's bytes)."""
    data = heavy_rows(rows).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [rows, 1024],
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + data, {"Inference-Header-Content-Length": str(len(header)), **FREE}


def executions(gateway: RunningGateway, model: str = "heavy") -> float:
    return gateway.metric("switchyard_batch_size_count", model=model)


def test_rest_answers_413_before_reading_when_content_length_too_big(shaped: RunningGateway) -> None:
    connection = http.client.HTTPConnection(shaped.http_url.split(":")[0], shaped.http_port, timeout=10)
    connection.putrequest("POST", "/v2/models/heavy/infer")
    connection.putheader("Content-Length", str(1 << 30))
    connection.putheader("X-API-Key", "k-free-0123")
    connection.endheaders()  # not a byte of the 1 GiB announced is sent: the answer must not wait for it
    response = connection.getresponse()
    assert response.status == 413
    assert json.loads(response.read()) == {
        "error": f"request body of {1 << 30} bytes exceeds the {MAX_BODY} byte limit"
    }
    connection.close()


def test_rest_answers_413_while_streaming_when_chunked_body_too_big(shaped: RunningGateway, web: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(64):  # 4 MiB in all, the limit is 2 MiB
            yield b"0" * 65536

    response = web.post(f"http://{shaped.http_url}/v2/models/heavy/infer", content=chunks(), headers=FREE)
    assert response.status_code == 413
    assert response.json()["error"].startswith(f"request body exceeds the {MAX_BODY} byte limit")


def test_grpc_answers_resource_exhausted_when_message_too_big(shaped: RunningGateway) -> None:
    rows = heavy_rows(1024)  # 4 MiB, the limit is 2 MiB
    with grpcclient.InferenceServerClient(shaped.grpc_url) as client:
        tensor = grpcclient.InferInput("input", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("heavy", [tensor], headers={"x-api-key": "k-free-0123"})
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_rest_and_grpc_answer_401_when_api_key_missing_or_unknown(shaped: RunningGateway, web: httpx.Client) -> None:
    body, headers = heavy_body(1)
    url = f"http://{shaped.http_url}/v2/models/heavy/infer"
    framing = {"Inference-Header-Content-Length": headers["Inference-Header-Content-Length"]}
    missing = web.post(url, content=body, headers=framing)
    wrong = web.post(url, content=body, headers={**headers, "X-API-Key": "k-guess"})
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert web.post(url, content=body, headers=headers).status_code == 200
    rows = heavy_rows(1)
    with grpcclient.InferenceServerClient(shaped.grpc_url) as client:
        tensor = grpcclient.InferInput("input", [1, 1024], "FP32")
        tensor.set_data_from_numpy(rows)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("heavy", [tensor], headers={"x-api-key": "k-guess"})
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        assert "unknown API key" in str(refused.value.message())
        client.infer("heavy", [tensor], headers={"x-api-key": "k-free-0123"})


def test_rest_and_grpc_answer_429_with_retry_after_when_tenant_bucket_empty(
    shaped: RunningGateway, web: httpx.Client
) -> None:
    body, headers = heavy_body(1)
    headers.update(LIMITED)
    url = f"http://{shaped.http_url}/v2/models/heavy/infer"
    answers = [web.post(url, content=body, headers=headers) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].headers["retry-after"] == "2"  # 0.5 tokens/s: the next one in 2 s at most, rounded up
    assert answers[2].headers["x-ratelimit-limit"] == "2"
    assert answers[2].headers["x-ratelimit-remaining"] == "0"
    channel = grpc.insecure_channel(shaped.grpc_url)
    try:
        stub = _stub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(_grpc_request(1), metadata=(("x-api-key", "k-limited-4567"),))
        error = refused.value
        assert isinstance(error, grpc.Call)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        trailers = dict(error.trailing_metadata() or ())
        assert trailers["retry-after"] in {"1", "2"}
        assert trailers["x-ratelimit-limit"] == "2"
    finally:
        channel.close()
    assert shaped.metric("switchyard_tenant_requests_total", tenant="limited", code="429") == 2


def test_rest_answers_504_without_executing_when_deadline_passes_in_queue(
    shaped: RunningGateway, web: httpx.Client
) -> None:
    slow_body, headers = heavy_body(256)
    url = f"http://{shaped.http_url}/v2/models/heavy/infer"
    before = executions(shaped)
    slow = _in_thread(lambda: web.post(url, content=slow_body, headers=headers, timeout=30))
    _wait_for_inflight(shaped)
    body, headers = heavy_body(1)
    late = web.post(url, content=body, headers={**headers, "X-Request-Timeout": "5"})
    assert slow.result().status_code == 200
    assert late.status_code == 504, late.text
    assert executions(shaped) - before == 1  # only the slow one ran
    assert shaped.metric("switchyard_rejected_total", model="heavy", reason="deadline") >= 1


def test_grpc_answers_deadline_exceeded_without_executing_when_call_deadline_passes(
    shaped: RunningGateway, web: httpx.Client
) -> None:
    # ``busy`` runs as long as asked (~1 s here), so the late call's 0.3 s deadline surely reaches the gateway and
    # surely passes while it waits: a deadline of a few ms could expire in the client or in grpc's core before the
    # gateway sees the call, and then nothing of ours would count it.
    before = executions(shaped, "busy")
    deadlines_before = shaped.metric("switchyard_rejected_total", model="busy", reason="deadline")
    slow = _in_thread(lambda: web.post(f"http://{shaped.http_url}/v2/models/busy/infer", json=_busy_body(100_000),
                                       headers=FREE, timeout=30))
    _wait_for_inflight(shaped, "busy")
    channel = grpc.insecure_channel(shaped.grpc_url)
    try:
        with pytest.raises(grpc.RpcError) as late:
            _stub(channel).ModelInfer(_busy_grpc_request(1), metadata=(("x-api-key", "k-free-0123"),), timeout=0.3)
        assert isinstance(late.value, grpc.Call)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        still_running = shaped.metric("switchyard_admission_executing", model="busy")
    finally:
        channel.close()
    assert slow.result().status_code == 200
    assert still_running == 1, "the slow request ended before the late call's deadline: make it slower"
    deadlines = eventually(lambda: shaped.metric("switchyard_rejected_total", model="busy", reason="deadline"),
                           deadlines_before + 1)
    assert deadlines == deadlines_before + 1
    assert executions(shaped, "busy") - before == 1  # only the slow one ran


def test_rest_and_grpc_shed_lowest_priority_first_when_queue_full(shaped: RunningGateway, web: httpx.Client) -> None:
    slow_body, headers = heavy_body(256)
    url = f"http://{shaped.http_url}/v2/models/heavy/infer"
    body, low_headers = heavy_body(1)
    slow = _in_thread(lambda: web.post(url, content=slow_body, headers=headers, timeout=30))
    _wait_for_inflight(shaped)
    low = _in_thread(lambda: web.post(url, content=body, headers={**low_headers, "X-Priority": "3"}, timeout=30))
    _wait_for_waiting(shaped, low)
    channel = grpc.insecure_channel(shaped.grpc_url)
    try:
        request = _grpc_request(1)
        request.parameters["priority"].uint64_param = 1
        high = _stub(channel).ModelInfer(request, metadata=(("x-api-key", "k-free-0123"),), timeout=30)
    finally:
        channel.close()
    shed = low.result()
    assert slow.result().status_code == 200
    assert high.model_name == "heavy"
    assert (shed.status_code, shed.headers["retry-after"]) == (503, "1"), shed.text
    assert "higher priority" in shed.json()["error"]


def test_rest_keeps_keep_alive_connection_when_model_fails(shaped: RunningGateway) -> None:
    one_row = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 3]}]}  # fails
    three_rows = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4], "data": [3] * 12}]}
    connection = http.client.HTTPConnection("127.0.0.1", shaped.http_port, timeout=10)
    answers = []
    for body in (one_row, three_rows, one_row, three_rows):
        connection.request("POST", "/v2/models/faulty/infer", body=json.dumps(body), headers=FREE)
        response = connection.getresponse()
        answers.append((response.status, json.loads(response.read()), response.getheader("x-request-id")))
    connection.close()
    assert [status for status, _, _ in answers] == [500, 200, 500, 200]  # one connection throughout
    status, failure, request_id = answers[0]
    assert request_id is not None
    assert failure == {
        "error": f"inference failed on model 'faulty' version 1; the gateway log has the cause "
        f"(request id {request_id})"
    }
    assert shaped.metric("switchyard_requests_total", model="faulty", version="1", protocol="http", code="500") == 2


class _Result:
    def __init__(self) -> None:
        self.value: httpx.Response | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def result(self) -> httpx.Response:
        assert self.done.wait(60)
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


def _in_thread(call: Callable[[], httpx.Response]) -> _Result:
    result = _Result()

    def run() -> None:
        try:
            result.value = call()
        except BaseException as exc:  # handed to the test thread
            result.error = exc
        finally:
            result.done.set()

    threading.Thread(target=run, daemon=True).start()
    return result


def _wait_for_inflight(gateway: RunningGateway, model: str = "heavy") -> None:
    deadline = time.monotonic() + 10
    while gateway.metric("switchyard_admission_executing", model=model) < 1:
        assert time.monotonic() < deadline, "the slow request never started"
        time.sleep(0.002)


def _wait_for_waiting(gateway: RunningGateway, low: _Result) -> None:
    deadline = time.monotonic() + 10
    while gateway.metric("switchyard_admission_waiting", model="heavy") < 1:
        if low.done.is_set():
            raise AssertionError(f"the low-priority request was answered before it queued: {low.result().text}")
        assert time.monotonic() < deadline, "the low-priority request never queued"
        time.sleep(0.002)


def _stub(channel: grpc.Channel) -> Any:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _grpc_request(rows: int) -> Any:
    request = service_pb2.ModelInferRequest(model_name="heavy")
    request.inputs.add(name="input", datatype="FP32", shape=[rows, 1024])
    request.raw_input_contents.append(heavy_rows(rows).tobytes())
    return request


def _busy_body(iterations: int) -> dict[str, Any]:
    inputs = busy_inputs(iterations)
    return {"inputs": [{"name": name, "shape": list(value.shape), "datatype": "FP32" if name == "x" else "INT64",
                        "data": value.ravel().tolist()} for name, value in inputs.items()]}


def _busy_grpc_request(iterations: int) -> Any:
    request = service_pb2.ModelInferRequest(model_name="busy")
    for name, value in busy_inputs(iterations).items():
        request.inputs.add(name=name, datatype="FP32" if name == "x" else "INT64", shape=list(value.shape))
        request.raw_input_contents.append(value.tobytes())
    return request


def _gone(gateway: RunningGateway) -> float:
    """Cancelled requests of ``busy`` over gRPC, counted against the version they were routed to (the request names
    none)."""
    return gateway.metric("switchyard_requests_total", model="busy", version="1", protocol="grpc", code="499")


def test_grpc_calls_and_stream_requests_their_clients_cancel_are_counted_as_499(shaped: RunningGateway) -> None:
    """A client that gives up (cancels its call, closes its stream) while its request runs: without a count the
    request vanishes from switchyard_requests_total, and a wave of clients giving up would read as less traffic."""
    metadata = (("x-api-key", "k-free-0123"),)
    before = _gone(shaped)
    channel = grpc.insecure_channel(shaped.grpc_url)
    try:
        call = _stub(channel).ModelInfer.future(_busy_grpc_request(100_000), metadata=metadata, timeout=30)
        _wait_for_inflight(shaped, "busy")
        assert call.cancel()
        assert eventually(lambda: _gone(shaped), before + 1) == before + 1

        stream_cancelled = threading.Event()

        def requests() -> Iterator[Any]:
            request = _busy_grpc_request(100_000)
            request.id = "given-up"
            yield request
            stream_cancelled.wait(30)  # the client keeps its side open: it is the cancel that ends the stream

        _wait_for_idle(shaped)
        stream = _stub(channel).ModelStreamInfer(requests(), metadata=metadata, timeout=30)
        _wait_for_inflight(shaped, "busy")
        assert stream.cancel()
        stream_cancelled.set()
        assert eventually(lambda: _gone(shaped), before + 2) == before + 2
    finally:
        channel.close()
    assert shaped.metric("switchyard_requests_total", model="busy", version="", protocol="grpc", code="504") == 0


def _wait_for_idle(gateway: RunningGateway, model: str = "busy") -> None:
    """Until the model's last request (cancelled, but still running in onnxruntime) has finished."""
    deadline = time.monotonic() + 30
    while gateway.metric("switchyard_admission_executing", model=model) > 0:
        assert time.monotonic() < deadline, "the cancelled request kept running for 30 s"
        time.sleep(0.01)


def _http_counted(gateway: RunningGateway, code: str) -> float:
    return gateway.metric("switchyard_requests_total", model="busy", version="1", protocol="http", code=code)


def _sent_and_left_open(gateway: RunningGateway, iterations: int) -> socket.socket:
    """A connection that has sent one whole request for ``busy`` and waits for its answer."""
    body = json.dumps(_busy_body(iterations)).encode()
    host, port = gateway.http_url.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=10)
    connection.sendall(b"POST /v2/models/busy/infer HTTP/1.1\r\nHost: gateway\r\nX-API-Key: k-free-0123\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return connection


def test_http_requests_whose_client_closes_the_connection_are_counted_as_499_and_leave_the_queue(
    shaped: RunningGateway,
) -> None:
    """A client that gives up on an HTTP request (closes its connection) while it runs, or while it waits for the
    one concurrency slot: each counts as 499 against the version it was routed to, never as the 200 no one receives,
    and the waiting one leaves the queue without running."""
    _wait_for_idle(shaped)
    gone, served = _http_counted(shaped, "499"), _http_counted(shaped, "200")
    runs = executions(shaped, "busy")

    running = _sent_and_left_open(shaped, 100_000)
    _wait_for_inflight(shaped, "busy")
    waiting = _sent_and_left_open(shaped, 1)
    assert eventually(lambda: shaped.metric("switchyard_admission_waiting", model="busy"), 1) == 1
    waiting.close()
    assert eventually(lambda: shaped.metric("switchyard_admission_waiting", model="busy"), 0) == 0
    assert eventually(lambda: _http_counted(shaped, "499"), gone + 1) == gone + 1

    running.close()
    assert eventually(lambda: _http_counted(shaped, "499"), gone + 2) == gone + 2
    # onnxruntime finishes the running one's batch (it cannot be stopped midway), and its answer is dropped.
    assert eventually(lambda: executions(shaped, "busy"), runs + 1) == runs + 1
    assert _http_counted(shaped, "200") == served

    # The next request is served as usual, and the one that waited never ran: queued before it, it would have run
    # as a batch of its own first.
    answer = httpx.post(f"http://{shaped.http_url}/v2/models/busy/infer", json=_busy_body(1), headers=FREE)
    assert answer.status_code == 200, answer.text
    assert _http_counted(shaped, "200") == served + 1
    assert executions(shaped, "busy") == runs + 2
