"""The load clients: a bounded closed loop of N clients, driven over raw HTTP/1.1 (binary or JSON bodies), the
KServe v2 gRPC stub, or tritonclient's gRPC client, unary or on ``ModelStreamInfer`` streams (one per client). Each
run returns (requests, measured seconds, latencies ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2_grpc

STRETCH_LIMIT = 20  # a window asked to hold some answers stretches to at most this many times its length
STRETCH_FLOOR_S = 30.0  # ... and may always stretch to this many seconds


async def closed_loop(
    send: Callable[[], Awaitable[None]], concurrency: int, duration: float, warmup: float, at_least: int = 0
) -> tuple[int, float, list[float]]:
    """``concurrency`` clients sharing one ``send`` (which picks a free connection when it needs one)."""
    return await closed_loops([send] * concurrency, duration, warmup, at_least)


async def closed_loops(
    sends: list[Callable[[], Awaitable[None]]], duration: float, warmup: float, at_least: int = 0
) -> tuple[int, float, list[float]]:
    """One client per ``send``, each sending its next request when the previous one was answered.

    The measured window is ``duration`` seconds, stretched until ``at_least`` requests sent in it were answered (for
    at most ``STRETCH_LIMIT`` times ``duration``, and never less than ``STRETCH_FLOOR_S``): on a busy machine one
    answer can take longer than a short window, and a figure of 0 answers would measure nothing. The figure stays
    honest either way, since the seconds returned are the seconds the window really lasted."""
    latencies: list[float] = []
    clock = time.perf_counter  # uvloop's loop.time() only has millisecond resolution
    measure_from = clock() + warmup
    stop = measure_from + duration
    give_up = measure_from + max(duration * STRETCH_LIMIT, STRETCH_FLOOR_S)
    sent = 0  # requests sent in the window, answered or not: enough of them in flight ends the stretch too

    def window_over(began: float) -> bool:
        return began >= give_up or (began >= stop and sent >= at_least)

    async def client(send: Callable[[], Awaitable[None]]) -> None:
        nonlocal sent
        while True:
            began = clock()
            if window_over(began):
                return
            if began >= measure_from:
                sent += 1
            await send()
            ended = clock()
            if began >= measure_from:
                latencies.append((ended - began) * 1e3)

    await asyncio.gather(*(client(send) for send in sends))
    measured = clock() - measure_from
    return len(latencies), measured, latencies


def binary_body(name: str, row: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(row.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": row.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return header + row.tobytes(), headers


def json_body(name: str, row: np.ndarray) -> bytes:
    tensor = {"name": name, "shape": list(row.shape), "datatype": "FP32", "data": row.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def http_request(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A complete HTTP/1.1 POST, built once and replayed: the load generator should cost little CPU."""
    path = "/" + url.split("/", 3)[3]
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def exchange(streams: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> tuple[int, bytes]:
    """One request on a kept-alive connection: its status and body, read with a minimal HTTP/1.1 reader (the
    gateway's answers carry a Content-Length)."""
    reader, writer = streams
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return int(head[9:12]), await reader.readexactly(length)


async def run_http(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, duration: float, warmup: float,
    at_least: int = 0,
) -> tuple[int, float, list[float]]:
    """Closed loop over keep-alive connections, one per client, with a minimal HTTP/1.1 reader; the window holds
    ``at_least`` answers (see ``closed_loops``)."""
    host, port = url.split("/")[2].split(":")
    request = http_request(url, body, headers)
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(concurrency)]
    free = list(connections)

    async def send() -> None:
        streams = free.pop()
        try:
            status, answer = await exchange(streams, request)
            if status != 200:
                raise RuntimeError(f"{url} answered {status}: {answer[:300]!r}")
        finally:
            free.append(streams)

    try:
        return await closed_loop(send, concurrency, duration, warmup, at_least)
    finally:
        for _, writer in connections:
            writer.close()


async def run_grpc(
    target: str, request: Any, concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    """Closed loop over one channel with the generated stub: a prebuilt request, no client-side wrapping."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def send() -> None:
            await stub.ModelInfer(request)

        return await closed_loop(send, concurrency, duration, warmup)


async def run_tritonclient_grpc(
    target: str, model: str, name: str, row: np.ndarray, concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    """Closed loop through tritonclient.grpc.aio, the client a Triton user would call."""
    client = grpcaio.InferenceServerClient(target)
    tensor = grpcaio.InferInput(name, list(row.shape), "FP32")
    tensor.set_data_from_numpy(row)

    async def send() -> None:
        await client.infer(model, [tensor])

    try:
        return await closed_loop(send, concurrency, duration, warmup)
    finally:
        await client.close()


class StreamAnswerError(RuntimeError):
    """A stream answered a request with an error, or ended instead of answering: the run would measure failures."""


def stream_answer(message: Any) -> Any:
    """The ``ModelInferResponse`` in a ``ModelStreamInferResponse`` read off a stream, or StreamAnswerError."""
    if message is grpc.aio.EOF:
        raise StreamAnswerError("the stream ended before answering its request (expected one answer per request)")
    if message.error_message:
        raise StreamAnswerError(f"the stream answered with an error instead of outputs: {message.error_message}")
    return message.infer_response


async def run_grpc_stream(
    target: str, request: Any, concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    """Closed loop with the generated stub, each client on a ``ModelStreamInfer`` stream of its own, opened before
    the run and kept for all of it: a prebuilt request written, its answer read, the next request written."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        streams = [stub.ModelStreamInfer() for _ in range(concurrency)]
        await asyncio.gather(*(stream.wait_for_connection() for stream in streams))

        def sender(stream: Any) -> Callable[[], Awaitable[None]]:
            async def send() -> None:
                await stream.write(request)
                stream_answer(await stream.read())

            return send

        try:
            return await closed_loops([sender(stream) for stream in streams], duration, warmup)
        finally:
            await asyncio.gather(*(_half_close(stream) for stream in streams), return_exceptions=True)


async def _half_close(stream: Any) -> None:
    """Ends a stream as a client should: no more requests, then its end read (the server may still log otherwise)."""
    await stream.done_writing()
    while await stream.read() is not grpc.aio.EOF:
        pass


async def run_tritonclient_stream(
    target: str, model: str, name: str, row: np.ndarray, concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    """Closed loop through tritonclient.grpc.aio's ``stream_infer``, each client on a stream of its own: the stream
    client a Triton user would call."""
    client = grpcaio.InferenceServerClient(target)
    tensor = grpcaio.InferInput(name, list(row.shape), "FP32")
    tensor.set_data_from_numpy(row)
    inputs = {"model_name": model, "inputs": [tensor]}
    queues: list[asyncio.Queue[dict[str, Any] | None]] = [asyncio.Queue() for _ in range(concurrency)]

    async def requests(queue: asyncio.Queue[dict[str, Any] | None]) -> AsyncIterator[dict[str, Any]]:
        while (item := await queue.get()) is not None:
            yield item

    answers = [client.stream_infer(requests(queue)) for queue in queues]

    def sender(queue: asyncio.Queue[dict[str, Any] | None], answer: Any) -> Callable[[], Awaitable[None]]:
        async def send() -> None:
            queue.put_nowait(inputs)
            _, error = await anext(answer)
            if error is not None:
                raise StreamAnswerError(f"the stream answered with an error instead of outputs: {error}")

        return send

    try:
        return await closed_loops([sender(q, a) for q, a in zip(queues, answers, strict=True)], duration, warmup)
    finally:
        for queue in queues:
            queue.put_nowait(None)  # the request iterator ends: the client half-closes the stream
        for answer in answers:
            with contextlib.suppress(StopAsyncIteration, grpc.RpcError):
                while True:
                    await anext(answer)
        await client.close()
