"""Inference requests answered by the lane straight from the HTTP connection (rest/direct.py), probed with raw
sockets against a gateway under its real server: keep-alive, pipelining, ``Connection: close``, HTTP/1.0,
``Expect: 100-continue``, chunked bodies and error answers behave as on uvicorn's own path; access logging takes
uvicorn's path."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.gateway.rest import connections
from services.gateway.settings import Settings
from tests.foreign_repository import addsub_repository_at
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports

PATH = b"/v2/models/addsub/infer"


@pytest.fixture(scope="module")
def addsub_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return addsub_repository_at(tmp_path_factory.mktemp("addsub_repository"))


class Counted:
    """Wraps ``answer_inference`` where the protocol calls it: how many requests took the direct lane."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.real(*args)


@pytest.fixture(scope="module")
def direct_calls() -> Iterator[Counted]:
    with pytest.MonkeyPatch.context() as patch:
        counted = Counted(connections.answer_inference)
        patch.setattr(connections, "answer_inference", counted)
        yield counted


@pytest.fixture(scope="module")
def gateway(addsub_repository: Path, direct_calls: Counted) -> Iterator[RunningGateway]:
    with running_gateway(Settings(repository=addsub_repository, port=0, grpc_port=0, keep_alive_s=5.0)) as running:
        yield running


def infer_body(start: int = 0) -> bytes:
    data = list(range(start, start + 16))
    inputs = [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": data} for n in ("INPUT0", "INPUT1")]
    return json.dumps({"inputs": inputs}).encode()


def post(body: bytes, *extra: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    head = [b"POST " + PATH + b" " + version, b"host: 127.0.0.1", b"content-type: application/json",
            b"content-length: %d" % len(body), *extra]  # fmt: skip
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Wire:
    """One raw connection and a reader of whole HTTP/1.1 answers (content-length framed)."""

    def __init__(self, gateway: RunningGateway) -> None:
        self.sock = socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10.0)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"the connection closed mid-answer: {self.buffer!r}"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines:
            name, value = line.split(":", 1)
            assert name.lower() not in headers, f"header {name} twice in {head!r}"
            headers[name.lower()] = value.strip()
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            assert self._fill(), "the connection closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def closed_by_server(self) -> bool:
        return not self._fill() and not self.buffer

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def wire(gateway: RunningGateway) -> Iterator[Wire]:
    opened = Wire(gateway)
    yield opened
    opened.close()


def sums(body: bytes) -> list[int]:
    outputs = {output["name"]: output["data"] for output in json.loads(body)["outputs"]}
    return list(outputs["OUTPUT0"])


def test_direct_lane_answers_every_request_on_one_connection_when_kept_alive(
    wire: Wire, direct_calls: Counted
) -> None:
    before = direct_calls.calls
    for start in range(40):
        wire.send(post(infer_body(start)))
        status, headers, body = wire.answer()
        assert status == 200, body
        assert sums(body) == [2 * (start + i) for i in range(16)]
    assert direct_calls.calls - before == 40
    assert headers["content-type"] == "application/json"
    assert headers["x-model-version"] == "1"
    assert headers["keep-alive"] == "timeout=5"
    assert "date" in headers
    assert "connection" not in headers
    assert "server" not in headers


def test_direct_lane_answers_pipelined_requests_in_order_when_mixed_with_other_routes(wire: Wire) -> None:
    health = b"GET /v2/health/ready HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    wire.send(post(infer_body(1)) + health + post(infer_body(2)) + post(b"{not json"))
    answers = [wire.answer() for _ in range(4)]
    assert [status for status, _, _ in answers] == [200, 200, 200, 400]
    assert sums(answers[0][2]) == [2 * (1 + i) for i in range(16)]
    assert json.loads(answers[1][2]) == {"ready": True}
    assert sums(answers[2][2]) == [2 * (2 + i) for i in range(16)]
    assert "failed to parse the request JSON buffer" in json.loads(answers[3][2])["error"]


def test_direct_lane_keeps_the_connection_when_it_answers_an_error(wire: Wire) -> None:
    wire.send(post(b'{"inputs": [{"name": "INPUT0"}]}'))
    status, headers, body = wire.answer()
    assert status == 400, body
    assert headers["content-type"] == "application/json"
    wire.send(post(infer_body()))
    assert wire.answer()[0] == 200


def test_direct_lane_closes_after_answering_when_client_asks_connection_close(wire: Wire) -> None:
    wire.send(post(infer_body(), b"connection: close"))
    status, headers, _ = wire.answer()
    assert status == 200
    assert headers["connection"] == "close"
    assert wire.closed_by_server()


def test_direct_lane_closes_after_answering_when_request_is_http_1_0(wire: Wire) -> None:
    wire.send(post(infer_body(), version=b"HTTP/1.0"))
    status, headers, _ = wire.answer()
    assert status == 200
    assert headers["connection"] == "close"
    assert wire.closed_by_server()


def test_direct_lane_sends_100_continue_before_the_answer_when_client_expects_it(wire: Wire) -> None:
    body = infer_body(3)
    request = post(body, b"expect: 100-continue")
    wire.send(request[: -len(body)])  # headers only: the client waits for the go-ahead
    while b"\r\n\r\n" not in wire.buffer:
        assert wire._fill()
    assert wire.buffer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    wire.buffer = wire.buffer[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
    wire.send(body)
    status, _, answer = wire.answer()
    assert status == 200
    assert sums(answer) == [2 * (3 + i) for i in range(16)]


def test_direct_lane_reads_the_whole_body_when_it_comes_chunked(wire: Wire) -> None:
    body = infer_body(4)
    middle = len(body) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:middle], body[middle:])) + b"0\r\n\r\n"
    head = b"POST " + PATH + b" HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n\r\n"
    wire.send(head + chunks)
    status, _, answer = wire.answer()
    assert status == 200, answer
    assert sums(answer) == [2 * (4 + i) for i in range(16)]


def test_uvicorn_path_answers_inference_when_access_log_is_on(addsub_repository: Path, direct_calls: Counted) -> None:
    settings = Settings(repository=addsub_repository, port=0, grpc_port=0, access_log=True)
    with running_gateway(settings) as logged:
        before = direct_calls.calls
        opened = Wire(logged)
        try:
            opened.send(post(infer_body(5)))
            status, _, body = opened.answer()
        finally:
            opened.close()
    assert status == 200
    assert sums(body) == [2 * (5 + i) for i in range(16)]
    assert direct_calls.calls == before  # logged by uvicorn's send, which the direct lane skips


def test_direct_lane_waits_for_the_rest_of_the_body_when_it_arrives_in_pieces(wire: Wire) -> None:
    request = post(infer_body(6))
    middle = len(request) - 40  # headers and most of the body, then the tail a little later
    wire.send(request[:middle])
    time.sleep(0.2)
    wire.send(request[middle:])
    status, _, answer = wire.answer()
    assert status == 200, answer
    assert sums(answer) == [2 * (6 + i) for i in range(16)]
