"""The load clients: a bounded closed loop of N clients, driven over raw HTTP/1.1 (binary or JSON bodies), the
KServe v2 gRPC stub, or tritonclient's gRPC client. Each run returns (requests, measured seconds, latencies ms).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2_grpc


async def closed_loop(
    send: Callable[[], Awaitable[None]], concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    latencies: list[float] = []
    clock = time.perf_counter  # uvloop's loop.time() only has millisecond resolution
    measure_from = clock() + warmup
    stop = measure_from + duration

    async def client() -> None:
        while True:
            began = clock()
            if began >= stop:
                return
            await send()
            ended = clock()
            if began >= measure_from:
                latencies.append((ended - began) * 1e3)

    await asyncio.gather(*(client() for _ in range(concurrency)))
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


async def run_http(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    """Closed loop over keep-alive connections, one per client, with a minimal HTTP/1.1 reader."""
    host, port = url.split("/")[2].split(":")
    request = http_request(url, body, headers)
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(concurrency)]
    free = list(connections)

    async def send() -> None:
        reader, writer = free.pop()
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            answer = await reader.readexactly(length)
            if head[9:12] != b"200":
                raise RuntimeError(f"{url} answered {head[9:12]!r}: {answer[:300]!r}")
        finally:
            free.append((reader, writer))

    try:
        return await closed_loop(send, concurrency, duration, warmup)
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
