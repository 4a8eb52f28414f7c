"""The real app over a scripted backend, served through its lifespan, with an HTTP client (in process) and a gRPC
stub on its real gRPC port: for the tests that check one behaviour over both protocols."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import httpx
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend
from tritonclient.grpc import service_pb2_grpc

from services.gateway.app import create_app
from services.gateway.settings import Settings

Clients = tuple[httpx.AsyncClient, service_pb2_grpc.GRPCInferenceServiceStub]


@asynccontextmanager
async def both_protocols(
    backend: ScriptedBackend, settings: Settings, registry: CollectorRegistry | None = None, **changes: object
) -> AsyncIterator[Clients]:
    """``settings`` with ``changes`` (and a gRPC port picked by the system)."""
    app = create_app(
        settings.model_copy(update={"grpc_port": 0, **changes}),
        backend=backend,
        registry=registry if registry is not None else CollectorRegistry(),
    )
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://gateway") as http,
            grpc.aio.insecure_channel(f"127.0.0.1:{app.state.grpc_port}") as channel,
        ):
            yield http, service_pb2_grpc.GRPCInferenceServiceStub(channel)
