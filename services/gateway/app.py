"""App factory: the FastAPI app whose lifespan starts the backend and the gRPC server on the same loop."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from services.extras import runtime_conflict
from services.gateway.backends.base import Backend
from services.gateway.backends.embedded import EmbeddedBackend
from services.gateway.backends.triton import ConfigTransform, TritonBackend, identity
from services.gateway.dataplane import SERVER_VERSION, DataPlane
from services.gateway.grpc_api import start_server
from services.gateway.metrics import GatewayMetrics
from services.gateway.rest import Endpoints, add_routes
from services.gateway.settings import Settings

log = logging.getLogger(__name__)


class BackendNotImplemented(Exception):
    """The configured backend is not available in this build."""


def build_backend(
    settings: Settings, metrics: GatewayMetrics, config_transform: ConfigTransform | None = None
) -> Backend:
    """``config_transform`` maps each model config to what the Triton server should load; the local CPU Triton
    launcher hands in its python-backend twin transform, a production Triton loads the configs as they are."""
    if settings.backend == "triton":
        transform = config_transform or identity
        return TritonBackend(settings.repository, settings, transform=transform, metrics=metrics)
    return EmbeddedBackend(
        settings.repository,
        metrics=metrics,
        intra_op_threads=settings.intra_op_threads,
        spinning=settings.intra_op_spinning,
        adaptive_delay=settings.batch_adaptive_delay,
    )


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    registry: CollectorRegistry | None = None,
    config_transform: ConfigTransform | None = None,
) -> FastAPI:
    """``app.state.dataplane`` is the core; ``app.state.grpc_port`` is the bound gRPC port once started."""
    metrics = GatewayMetrics(registry if registry is not None else CollectorRegistry())
    if backend is None:
        backend = build_backend(settings, metrics, config_transform)
    dataplane = DataPlane(backend, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        conflict = runtime_conflict()
        if conflict is not None:
            log.error("%s", conflict)
        await dataplane.backend.start()
        dataplane.refresh_active_versions()
        grpc_server = None
        if settings.grpc_port is not None:
            grpc_server, app.state.grpc_port = await start_server(
                dataplane, settings.host, settings.grpc_port, max_message_bytes=settings.max_body_bytes
            )
            log.info("gRPC listening on %s:%d", settings.host, app.state.grpc_port)
        if settings.gc_freeze:
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(settings.grpc_shutdown_grace_s)
            await dataplane.backend.close()

    app = FastAPI(title="Switchyard gateway", version=SERVER_VERSION, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.dataplane = dataplane
    app.state.grpc_port = None
    add_routes(app, Endpoints(dataplane, max_body_bytes=settings.max_body_bytes))
    return app
