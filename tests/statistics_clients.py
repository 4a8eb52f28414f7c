"""Helpers for the statistics extension tests: inference and statistics through each ``tritonclient`` flavour
(HTTP, HTTP aio, gRPC, gRPC aio), read into one shape whatever the flavour answers."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from services.gateway.tensors.types import Array

CLIENTS = ("http", "http_aio", "grpc", "grpc_aio")


@dataclass(frozen=True)
class Endpoint:
    http_url: str
    grpc_url: str


@dataclass(frozen=True)
class Figures:
    """One ``model_stats`` entry, from JSON (HTTP) or the protobuf message (gRPC)."""

    name: str
    version: str
    last_inference: int
    inference_count: int
    execution_count: int
    success: int
    fail: int
    queue_count: int
    queue_ns: int
    compute_infer_count: int
    compute_infer_ns: int
    batch_executions: int
    """Executions summed over ``batch_stats``: ``execution_count`` again, counted per batch size."""

    @staticmethod
    def from_json(stats: dict[str, Any]) -> Figures:
        inference = stats["inference_stats"]
        return Figures(
            name=stats["name"],
            version=stats["version"],
            last_inference=stats["last_inference"],
            inference_count=stats["inference_count"],
            execution_count=stats["execution_count"],
            success=inference["success"]["count"],
            fail=inference["fail"]["count"],
            queue_count=inference["queue"]["count"],
            queue_ns=inference["queue"]["ns"],
            compute_infer_count=inference["compute_infer"]["count"],
            compute_infer_ns=inference["compute_infer"]["ns"],
            batch_executions=sum(batch["compute_infer"]["count"] for batch in stats["batch_stats"]),
        )

    @staticmethod
    def from_message(stats: Any) -> Figures:
        inference = stats.inference_stats
        return Figures(
            name=stats.name,
            version=stats.version,
            last_inference=stats.last_inference,
            inference_count=stats.inference_count,
            execution_count=stats.execution_count,
            success=inference.success.count,
            fail=inference.fail.count,
            queue_count=inference.queue.count,
            queue_ns=inference.queue.ns,
            compute_infer_count=inference.compute_infer.count,
            compute_infer_ns=inference.compute_infer.ns,
            batch_executions=sum(batch.compute_infer.count for batch in stats.batch_stats),
        )


async def send(kind: str, endpoint: Endpoint, model: str, version: str, inputs: dict[str, Array], count: int) -> None:
    """``count`` requests one after the other, each with ``inputs``, through the ``kind`` client."""
    module: Any = grpcclient if kind.startswith("grpc") else httpclient
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client = _client(kind, endpoint)
    try:
        for _ in range(count):
            answer = client.infer(model, tensors, model_version=version)
            if kind.endswith("aio"):
                await answer
    finally:
        await _close(kind, client)


async def read(kind: str, endpoint: Endpoint, model: str = "", version: str = "") -> list[Figures]:
    """``get_inference_statistics`` through the ``kind`` client; raises its ``InferenceServerException``."""
    client = _client(kind, endpoint)
    try:
        if kind.startswith("grpc"):
            call = client.get_inference_statistics(model, version, as_json=False)
            answer = await call if kind.endswith("aio") else call
            return [Figures.from_message(stats) for stats in answer.model_stats]
        call = client.get_inference_statistics(model, version)
        answer = await call if kind.endswith("aio") else call
        return [Figures.from_json(stats) for stats in answer["model_stats"]]
    finally:
        await _close(kind, client)


async def read_one(kind: str, endpoint: Endpoint, model: str, version: str) -> Figures:
    found = await read(kind, endpoint, model, version)
    assert [(f.name, f.version) for f in found] == [(model, version)]
    return found[0]


async def settled(kind: str, endpoint: Endpoint, model: str, version: str, success: int) -> Figures:
    """Statistics once ``success`` requests are counted: Triton counts a request just after answering it. Waits up
    to 5 s, then answers what it has."""
    deadline = time.monotonic() + 5.0
    while True:
        figures = await read_one(kind, endpoint, model, version)
        if figures.success >= success or time.monotonic() > deadline:
            return figures
        await asyncio.sleep(0.05)


def raw_statistics(endpoint: Endpoint, path: str) -> httpx.Response:
    """``GET {path}`` on the HTTP port, for what tritonclient does not show (status codes, ``gateway_stats``)."""
    return httpx.get(f"http://{endpoint.http_url}{path}", timeout=10)


def _client(kind: str, endpoint: Endpoint) -> Any:
    if kind == "http":
        return httpclient.InferenceServerClient(endpoint.http_url)
    if kind == "http_aio":
        return httpaio.InferenceServerClient(endpoint.http_url)
    if kind == "grpc":
        return grpcclient.InferenceServerClient(endpoint.grpc_url)
    return grpcaio.InferenceServerClient(endpoint.grpc_url)


async def _close(kind: str, client: Any) -> None:
    closed = client.close()
    if kind.endswith("aio"):
        await closed
