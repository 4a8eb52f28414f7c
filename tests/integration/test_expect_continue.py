"""``Expect: 100-continue`` met by an early refusal on the direct lane: the gateway answers 401 / 429 before asking
for the body (no ``100 Continue``), keeps the connection, reads the body if the client sends it anyway (as RFC 9110
lets it) and serves the next request on the same connection; a 413 closes it, since the body it refused would
otherwise be read as the next request."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.shaping_models import faulty_repository

pytestmark = pytest.mark.slow
FREE, LIMITED = "k-free-0123", "k-limited-4567"
PATH = b"/v2/models/faulty/infer"
LIMITS = """
[tenants.limited]
rps = 0.001
burst = 1
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    root = tmp_path_factory.mktemp("expect")
    (root / "limits.toml").write_text(LIMITS)
    settings = Settings(
        repository=faulty_repository(root / "repository"),
        port=0,
        grpc_port=0,
        repository_poll_s=0,
        api_keys=SecretStr(f"{FREE}:free,{LIMITED}:limited"),
        limits_file=root / "limits.toml",
        rate_limit_rps=1000.0,
        max_body_bytes=4096,
    )  # type: ignore[call-arg]
    with running_gateway(settings) as running:
        yield running


class Connection:
    def __init__(self, gateway: RunningGateway) -> None:
        self.sock = socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10.0)
        self.buffer = b""

    def head_only(self, key: str | None, body: bytes, length: int | None = None) -> None:
        lines = [b"POST " + PATH + b" HTTP/1.1", b"host: 127.0.0.1", b"content-type: application/json",
                 b"content-length: %d" % (len(body) if length is None else length), b"expect: 100-continue"]
        if key is not None:
            lines.append(b"x-api-key: " + key.encode())
        self.sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")

    def request(self, key: str, body: bytes) -> None:
        head = [b"POST " + PATH + b" HTTP/1.1", b"host: 127.0.0.1", b"x-api-key: " + key.encode(),
                b"content-length: %d" % len(body)]
        self.sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, f"the connection closed mid-answer: {self.buffer!r}"
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            assert chunk, "the connection closed mid-body"
            self.buffer += chunk
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def closed_by_server(self) -> bool:
        return not self.buffer and not self.sock.recv(65536)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def connection(gateway: RunningGateway) -> Iterator[Connection]:
    opened = Connection(gateway)
    yield opened
    opened.close()


def body(rows: int = 1) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                                   "data": [0.0] * (4 * rows)}]}).encode()


def _refused_then_reused(connection: Connection, key: str | None, status: int) -> dict[str, str]:
    connection.head_only(key, body())
    got, headers, _ = connection.answer()
    assert got == status  # a final answer first: never "100 Continue" for a request already refused
    assert "connection" not in headers
    connection.sock.sendall(body())  # the client may send the body anyway; it belongs to the refused request
    connection.request(FREE, body())
    got, _, answer = connection.answer()
    assert got == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == [0.0] * 4
    return headers


def test_a_401_before_the_body_keeps_the_connection_for_the_next_request(connection: Connection) -> None:
    _refused_then_reused(connection, None, 401)


def test_a_429_before_the_body_keeps_the_connection_for_the_next_request(
    connection: Connection, gateway: RunningGateway
) -> None:
    spend = Connection(gateway)
    try:
        spend.request(LIMITED, body())  # the limited tenant's one token
        assert spend.answer()[0] == 200
    finally:
        spend.close()
    headers = _refused_then_reused(connection, LIMITED, 429)
    assert int(headers["retry-after"]) > 0


def test_a_413_before_the_body_closes_the_connection(connection: Connection) -> None:
    connection.head_only(FREE, b"", length=5000)
    status, headers, _ = connection.answer()
    assert status == 413
    assert headers["connection"] == "close"
    assert connection.closed_by_server()
