"""The HTTP transport to Triton: requests as Triton's binary tensor extension reads them, answers back into arrays,
Triton's error answers as the codes the error mapping reads, and kept-alive connections that a fault closes."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import orjson
import pytest

from services.gateway.backends.triton.http_codec import http_request, http_response
from services.gateway.backends.triton.http_pool import HttpPool
from services.gateway.errors import InferenceFailed
from services.gateway.tensors.types import InferInput, InferRequest, InferResponse


def request() -> InferRequest:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    return InferRequest(model="my model", version=None, inputs=[InferInput("x", "FP32", (2, 3), x)], id="r-1")


def answer(outputs: dict[str, np.ndarray]) -> tuple[int, bytes]:
    entries = [{"name": name, "datatype": "FP32", "shape": list(a.shape),
                "parameters": {"binary_data_size": a.nbytes}} for name, a in outputs.items()]  # fmt: skip
    header = orjson.dumps({"model_name": "m", "model_version": "3", "outputs": entries})
    return len(header), header + b"".join(a.tobytes() for a in outputs.values())


def test_http_request_carries_binary_tensors_deadline_and_priority_when_encoded() -> None:
    head, parts = http_request(request(), 3, 0.25, 2, b"triton:8000")
    body = b"".join(bytes(part) for part in parts)
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v2/models/my%20model/versions/3/infer HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    json_length = int(headers["Inference-Header-Content-Length"])
    assert int(headers["Content-Length"]) == len(body)
    header = json.loads(body[:json_length])
    assert header["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                                 "parameters": {"binary_data_size": 24}}]  # fmt: skip
    assert header["parameters"] == {"binary_data_output": True, "priority": 2, "timeout": 250000}
    assert header["id"] == "r-1"
    np.testing.assert_array_equal(np.frombuffer(body[json_length:], np.float32), np.arange(6, dtype=np.float32))


def test_http_response_gives_arrays_over_the_answer_when_outputs_are_binary() -> None:
    y = np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4)
    length, body = answer({"y": y, "z": y * 2})
    response = http_response(200, length, body, request(), 3)
    assert isinstance(response, InferResponse)
    assert (response.version, response.id) == (3, "r-1")
    np.testing.assert_array_equal(response.outputs[0].data, y)
    np.testing.assert_array_equal(response.outputs[1].data, y * 2)


@pytest.mark.parametrize(
    ("status", "code"), [(400, "INVALID_ARGUMENT"), (404, "NOT_FOUND"), (503, "UNAVAILABLE"), (500, "INTERNAL")]
)
def test_http_response_names_the_code_and_tritons_words_when_triton_refuses(status: int, code: str) -> None:
    assert http_response(status, None, b'{"error":"Request timeout expired"}', request(), 3) == (
        code, "Request timeout expired"
    )


def test_http_response_raises_inference_failed_when_the_answer_is_not_v2() -> None:
    with pytest.raises(InferenceFailed, match="not a v2 response"):
        http_response(200, None, b"<html>proxy error</html>", request(), 3)


async def serve(answers: list[bytes]) -> tuple[asyncio.Server, list[int]]:
    """A socket server that answers each request with the next raw answer and counts connections."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = int(next(line for line in lines if line.lower().startswith(b"content-length")).split(b":")[1])
            await reader.readexactly(length)
            sent = answers.pop(0)
            writer.write(sent)
            await writer.drain()
            if b"connection: close" in sent.lower():
                break
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), connections


def ok(body: bytes, close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def test_http_pool_reuses_one_connection_when_calls_follow_each_other() -> None:
    server, connections = await serve([ok(b"a"), ok(b"bb"), ok(b"ccc")])
    port = server.sockets[0].getsockname()[1]
    pool = HttpPool("127.0.0.1", port)
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"
    bodies = [(await pool.call(head, [b"."])).body for _ in range(3)]
    pool.close()
    server.close()
    assert bodies == [b"a", b"bb", b"ccc"]
    assert len(connections) == 1


async def test_http_pool_opens_a_new_connection_when_triton_closed_the_last_one() -> None:
    server, connections = await serve([ok(b"a", close=True), ok(b"b")])
    port = server.sockets[0].getsockname()[1]
    pool = HttpPool("127.0.0.1", port)
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"
    first = await pool.call(head, [b"."])
    second = await pool.call(head, [b"."])
    pool.close()
    server.close()
    assert (first.body, second.body) == (b"a", b"b")
    assert len(connections) == 2


async def test_http_pool_raises_connection_error_when_triton_hangs_up_mid_answer() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    pool = HttpPool("127.0.0.1", server.sockets[0].getsockname()[1])
    with pytest.raises(ConnectionError, match="closed the connection"):
        await pool.call(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", [])
    pool.close()
    server.close()
