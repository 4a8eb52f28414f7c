"""App factory: the FastAPI app whose lifespan starts the version manager (and through it the backend) and the
gRPC server on the same loop."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from services.extras import runtime_conflict
from services.gateway.admin import AdminAuth, AdminEndpoints, add_admin_routes
from services.gateway.admin.console import Console, add_console_routes
from services.gateway.admin.live import LiveFigures
from services.gateway.backends.base import Backend
from services.gateway.backends.embedded_settings import embedded_backend
from services.gateway.backends.nvml import register_gpu_metrics
from services.gateway.backends.triton import ConfigTransform, TritonBackend, identity
from services.gateway.capacity.backend import with_model_cache
from services.gateway.dataplane import SERVER_VERSION, DataPlane
from services.gateway.grpc_api import start_server
from services.gateway.inference_log.sinks import open_sink
from services.gateway.inference_log.writer import InferenceLog
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog, RepositoryError
from services.gateway.repository_api import RepositoryApi, RepositoryAuth
from services.gateway.rest import Endpoints, add_routes
from services.gateway.rest.app import add_v2_routes
from services.gateway.rest.generate import generate_routes
from services.gateway.rest.lane import GatewayApp, InferLane
from services.gateway.rest.openapi import install_openapi
from services.gateway.rest.repository_routes import RepositoryEndpoints, add_repository_routes
from services.gateway.rest.shared_memory import SharedMemoryEndpoints, shared_memory_routes
from services.gateway.rest.traced_lane import TracedInferLane
from services.gateway.security import server_tls
from services.gateway.settings import Settings
from services.gateway.shaping.node_share import NodeShare
from services.gateway.shaping.shaper import Shaper
from services.gateway.state import FileStateStore, RedisStateStore, StateStore, default_state_path
from services.gateway.state.policies import InferenceLogPolicy
from services.gateway.state.worker_view import WorkerFileView
from services.gateway.tensors.shared_memory import SharedMemoryRegions
from services.gateway.tracing.observe import Observer
from services.gateway.tracing.setup import tracing_from_environment
from services.gateway.tracing.spans import Tracing
from services.gateway.tuning.service import TuneService
from services.gateway.versions.leases import Leases
from services.gateway.versions.manager import VersionManager
from services.gateway.versions.routing import Router
from services.gateway.versions.shadow import ShadowRunner
from services.gateway.versions.windows import TrafficWindows

log = logging.getLogger(__name__)


class BackendNotImplemented(Exception):
    """The configured backend is not available in this build."""


class NodeWorker(Protocol):
    """This process as one of a node's workers (``serve --workers N``; ``workers/node.py`` is the one there is)."""

    acting: bool
    """Whether it runs the node's version actions (worker 0)."""
    index: int
    """Its index among the node's workers (0 .. N-1)."""
    share: NodeShare
    """The node's shared rate-limit buckets and concurrency counts, attached by this process."""

    async def join(
        self, app: FastAPI, dataplane: DataPlane, manager: VersionManager, repository: RepositoryApi
    ) -> None:
        """Once the worker's models are loaded: take the node's internal calls, and answer for the node."""
        ...

    async def leave(self) -> None: ...


def build_backend(
    settings: Settings, catalog: Catalog, metrics: GatewayMetrics, config_transform: ConfigTransform | None = None
) -> Backend:
    """``config_transform`` maps each model config to what the Triton server should load; the local CPU Triton
    launcher hands in its python-backend twin transform, a production Triton loads the configs as they are."""
    if settings.backend == "triton":
        transform = config_transform or identity
        return TritonBackend(catalog, settings, transform=transform, metrics=metrics)
    return embedded_backend(catalog, settings, metrics=metrics, inline_batches=True)


def state_path(settings: Settings) -> Path:
    """Where the routing state lives; never inside the repository (Triton takes every folder there for a model)."""
    path = settings.state_path or default_state_path(settings.repository)
    if path.resolve().is_relative_to(settings.repository.resolve()):
        raise RepositoryError(f"the state file {path} lies inside the model repository; put it elsewhere")
    return path


def state_store(
    settings: Settings, node: NodeWorker | None = None, registry: CollectorRegistry | None = None
) -> StateStore:
    """``node``: with several workers, only worker 0 opens the routing file (and holds its lock); the others read
    it. On Redis every worker is a replica, as separate gateways are. ``registry``: where the Redis store counts the
    audit events it keeps while Redis cannot take them."""
    if settings.redis_url:
        return RedisStateStore(settings.redis_url, prefix=settings.redis_prefix, lock_ttl_s=settings.redis_lock_ttl_s,
                               registry=registry)
    if node is not None and not node.acting:
        return WorkerFileView(state_path(settings))
    return FileStateStore(state_path(settings))


LOG_CLOSE_S = 5.0
"""Longest a stopping gateway waits for the inference log to write what it holds: a dead sink must not hold it."""


def inference_log(
    settings: Settings, router: Router, metrics: GatewayMetrics, worker: int | None = None
) -> InferenceLog | None:
    """The inference log ``SWITCHYARD_INFERENCE_LOG`` names (``None``: off); each model's own sample and redactions
    are read from its routing record, which every replica and worker follows."""
    if not settings.inference_log:
        return None

    def policy(model: str) -> InferenceLogPolicy | None:
        record = router.record(model)
        return None if record is None else record.inference_log

    sink = open_sink(
        settings.inference_log, file_max_bytes=settings.inference_log_file_max_bytes,
        file_count=settings.inference_log_file_count, timeout_s=settings.inference_log_timeout_s, worker=worker,
    )
    return InferenceLog(
        sink, sample=settings.inference_log_sample, policy=policy, queue_size=settings.inference_log_queue,
        max_record_bytes=settings.inference_log_max_record_bytes, registry=metrics.registry,
        default_priority=settings.default_priority,
    )


def observer(
    settings: Settings, router: Router, backend: Backend, metrics: GatewayMetrics, worker: int | None = None
) -> Observer | None:
    """Traces (the standard ``OTEL_*`` variables) and the inference log, when either is on; the backend then records
    its stages (batch queue and run, the call to Triton) under each request's trace."""
    tracing = tracing_from_environment(os.environ, detail=settings.trace_detail)
    log_writer = inference_log(settings, router, metrics, worker)
    if tracing is None and log_writer is None:
        return None
    if tracing is not None and hasattr(backend, "trace"):  # test doubles may not record stages
        backend.trace()

    def canary_of(model: str) -> int | None:
        record = router.record(model)
        if record is None or record.canary is None or record.canary.version == record.stable:
            return None
        return record.canary.version

    return Observer(tracing, log_writer, canary_of)


async def preflight(settings: Settings) -> None:
    """What would stop the lifespan, checked before the server starts so that it fails with one clear line
    (``RepositoryError`` / ``StateError``) rather than a traceback: the state store's place, lock and content."""
    store = state_store(settings)
    await store.open()
    try:
        await store.load_routing()
    finally:
        await store.close()


def create_app(
    settings: Settings,
    *,
    backend: Backend | None = None,
    registry: CollectorRegistry | None = None,
    config_transform: ConfigTransform | None = None,
    node: NodeWorker | None = None,
) -> FastAPI:
    """``app.state.dataplane`` is the core, ``app.state.manager`` the version manager; ``app.state.grpc_port`` is
    the bound gRPC port once started. ``backend`` replaces the one ``settings`` name (tests). ``node``: this
    process is one of the node's workers (``serve --workers N``)."""
    metrics = GatewayMetrics(registry if registry is not None else CollectorRegistry())
    if node is None or node.acting:  # one worker reports the node's GPUs: the node's /metrics adds workers' up
        register_gpu_metrics(metrics.registry)
    # One TLS object for both listeners (uvicorn's is this one: ``app.state.tls``), so that the gauge shows the
    # certificate they present; it raises TlsError for files it cannot use.
    tls = server_tls(settings, expiry=metrics.tls_certificate_expiry)
    catalog = Catalog(settings.repository)
    if backend is None:
        backend = build_backend(settings, catalog, metrics, config_transform)
    backend, cache = with_model_cache(settings, catalog, metrics, backend)
    router, leases = Router(catalog, backend), Leases(metrics)
    router.on_demand = cache is not None
    store = state_store(settings, node, metrics.registry)
    windows, shadows = TrafficWindows(), ShadowRunner(backend, leases, metrics, settings.shadow_max_pending)
    manager = VersionManager(settings, catalog, backend, router, leases, store, metrics, windows, shadows)
    manager.cache = cache
    if cache is not None:  # a canary's or shadow's version the cache has not loaded is loaded in the background
        router.prefetch = shadows.prefetch = cache.prefetch
    shaper = Shaper(settings, metrics, share=node.share if node is not None else None)
    # One AdminAuth for every admin surface: the keys file's admin tokens are re-read with the API keys.
    admin_auth = AdminAuth(settings.admin_token, shaper.keys)
    repository_api = RepositoryApi(manager, RepositoryAuth(admin_auth, open_api=settings.repository_api_open))
    regions = SharedMemoryRegions(
        enabled=settings.shared_memory,
        max_regions=settings.shared_memory_max_regions,
        max_bytes=settings.shared_memory_max_bytes,
        mirror=backend.shared_memory if isinstance(backend, TritonBackend) else None,
    )
    dataplane = DataPlane(catalog, backend, router, leases, metrics, windows, shadows, shaper, regions=regions)
    dataplane.cache = cache
    worker = node.index if node is not None else None
    dataplane.observer = shadows.observer = observer(settings, router, backend, metrics, worker)
    tracing: Tracing | None = dataplane.observer.tracing if dataplane.observer is not None else None
    tuner = TuneService(manager)
    live = LiveFigures(metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        conflict = runtime_conflict()
        if conflict is not None:
            log.error("%s", conflict)
        if dataplane.observer is not None and dataplane.observer.log is not None:
            dataplane.observer.log.start()
        await manager.start(acting=node is None or node.acting)
        live.start()
        grpc_server = None
        if settings.grpc_port is not None:
            grpc_server, app.state.grpc_port = await start_server(
                dataplane,
                settings.host,
                settings.grpc_port,
                repository=repository_api,
                max_message_bytes=settings.max_body_bytes,
                max_metadata_bytes=settings.max_header_bytes,
                connection_idle_s=settings.keep_alive_s,
                handshake_timeout_s=settings.header_timeout_s,
                health_interval_s=settings.grpc_health_interval_s,
                health_max_watches=settings.grpc_health_max_watches,
                stream_max_inflight=settings.stream_max_inflight,
                stream_idle_timeout_s=settings.stream_idle_timeout_s,
                stream_max_open=settings.stream_max_open,
                reuse_port=node is not None,
                tls=tls,
            )
            log.info("gRPC listening on %s:%d", settings.host, app.state.grpc_port)
        if node is not None:
            await node.join(app, dataplane, manager, repository_api)
        if settings.gc_freeze:
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            if node is not None:
                await node.leave()
            if grpc_server is not None:
                await grpc_server.stop(settings.grpc_shutdown_grace_s)
            await live.close()
            await tuner.close()  # a run in progress is cancelled and unloads its trial
            await manager.close()
            await regions.close()  # unmapped, and unregistered from Triton while its connection is still open
            await backend.close()
            await shaper.close()
            if dataplane.observer is not None:
                dataplane.observer.close(min(settings.inference_log_timeout_s, LOG_CLOSE_S))

    app = GatewayApp(
        title="Switchyard gateway", version=SERVER_VERSION, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.dataplane = dataplane
    app.state.manager = manager
    app.state.live = live
    app.state.grpc_port = None
    app.state.tls = tls
    app.state.repository_api = repository_api
    if tracing is None:
        app.lane = InferLane(dataplane, max_body_bytes=settings.max_body_bytes)
    else:
        app.lane = TracedInferLane(dataplane, max_body_bytes=settings.max_body_bytes, tracing=tracing)
    add_routes(app, Endpoints(dataplane), app.lane)
    app.router.routes.extend(generate_routes(dataplane, max_body_bytes=settings.max_body_bytes, tracing=tracing))
    add_admin_routes(app, AdminEndpoints(manager, admin_auth, settings, tuner=tuner))
    add_console_routes(app, Console(manager, admin_auth, live))
    add_repository_routes(app, RepositoryEndpoints(repository_api, max_body_bytes=settings.max_body_bytes))
    add_v2_routes(app, shared_memory_routes(SharedMemoryEndpoints(dataplane)))
    install_openapi(app)
    return app
