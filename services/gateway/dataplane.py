"""The gateway's core: readiness, metadata and inference over a ``Backend``, shared by REST and gRPC.

It knows nothing of HTTP or gRPC; front ends translate to and from its types and ``GatewayError``s. Every
request is routed (``Router``) and holds a lease on its version (``Leases``) until its answer is ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from tritonclient.grpc import model_config_pb2

from services.gateway.backends.base import Backend
from services.gateway.errors import DeadlineExceeded, GatewayError, ModelNotReady
from services.gateway.leases import Leases
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.routing import Header, Router
from services.gateway.shadow import ShadowRunner
from services.gateway.traffic import TrafficWindows
from services.gateway.types import InferOutput, InferRequest, InferResponse, ModelMetadata, VersionState
from services.gateway.validation import validate

log = logging.getLogger(__name__)
SERVER_NAME = "switchyard"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "model_configuration")


class DataPlane:
    def __init__(
        self,
        catalog: Catalog,
        backend: Backend,
        router: Router,
        leases: Leases,
        metrics: GatewayMetrics,
        windows: TrafficWindows,
        shadows: ShadowRunner,
    ) -> None:
        self.catalog = catalog
        self.backend = backend
        self.router = router
        self.leases = leases
        self.metrics = metrics
        self.windows = windows
        self.shadows = shadows

    async def live(self) -> bool:
        """The gateway answering is its liveness. A dead backend makes it unready, not dead: a liveness
        probe must not restart a healthy gateway while Triton restarts."""
        return True

    async def ready(self) -> bool:
        """Ready when the backend is live and every model has settled: its stable version serves, or it failed
        for a reason waiting will not fix (logged, and told on ``/v2/models/{m}/ready``). One broken model must
        not keep a multi-model gateway out of its load balancer; a model still loading does."""
        if not await self.backend.live():
            return False
        router = self.router
        return all(router.ready(model) or router.problem(model) is not None for model in self.catalog.entries)

    def server_metadata(self) -> dict[str, object]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}

    def resolve(self, model: str, version: int | None) -> int:
        """The version a request is served by; 404 when unknown, 503 when it exists but is not ready."""
        return self.router.route(model, version)

    async def model_ready(self, model: str, version: int | None) -> bool:
        return await self.model_readiness(model, version) is None

    async def model_readiness(self, model: str, version: int | None) -> str | None:
        """``None`` when the model (version) answers requests now, else why not."""
        try:
            served = self.resolve(model, version)
        except ModelNotReady as exc:
            return str(exc)
        if await self.backend.ready(model, served):
            return None
        return f"model '{model}' version {served} is not ready"

    async def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        metadata = await self.backend.metadata(model, self.resolve(model, version))
        if version is None:  # like Triton: the unversioned answer lists every ready version
            versions = self.backend.models().get(model, {})
            ready = tuple(sorted(v for v, s in versions.items() if s is VersionState.READY))
            metadata = dataclasses.replace(metadata, versions=ready)
        return metadata

    async def model_config(self, model: str, version: int | None) -> model_config_pb2.ModelConfig:
        return await self.backend.config(model, self.resolve(model, version))

    async def infer(self, request: InferRequest, *, protocol: str, header: Header | None = None) -> InferResponse:
        """``header`` reads the request's headers (gRPC: metadata), for a sticky canary split."""
        started = time.perf_counter()
        model = request.model
        watched = request.version is None and model in self.windows.watched
        version: int | None = None
        try:
            version = self.router.route(model, request.version, header)
            # Admitted: from here until the answer is ready the version cannot be drained away.
            self.leases.acquire(model, version)
            try:
                validate(request, await self.backend.metadata(model, version))
                response = await self._call(request, version, started)
            finally:
                self.leases.release(model, version)
            response.outputs = self._select(request, response)
        except GatewayError as exc:
            served = version if version is not None else request.version
            self.record_error(model, "" if served is None else str(served), protocol, exc)
            if version is not None:
                exc.version = version  # the answer names the version that failed (a canary's, say)
                if watched:
                    self.windows.observe(model, version, exc.status, time.perf_counter() - started)
            raise
        except Exception as exc:  # a bug, not the client's fault: log it, leak nothing
            log.exception("unexpected error serving model '%s'", model)
            error = GatewayError("internal server error", 500)
            served = version if version is not None else request.version
            self.record_error(model, "" if served is None else str(served), protocol, error)
            raise error from exc
        elapsed = time.perf_counter() - started
        series = self.metrics.served(model, str(version), protocol)
        series.ok.inc()
        series.duration.observe(elapsed)
        if request.version is None:
            if watched:
                self.windows.observe(model, version, 200, elapsed)
            record = self.router.record(model)
            if record is not None and record.shadow is not None and version == record.stable:
                self.shadows.offer(record.shadow, request, response)
        return response

    def record_error(self, model: str, version: str, protocol: str, error: GatewayError) -> None:
        """Count a failed request; front ends call it for errors raised before ``infer`` (bad framing)."""
        self.metrics.requests.labels(model, version, protocol, str(error.status)).inc()
        if error.reason is not None:
            self.metrics.rejected.labels(model, error.reason).inc()

    async def _call(self, request: InferRequest, version: int, started: float) -> InferResponse:
        timeout = request.timeout_s
        if timeout is None:
            return await self.backend.infer(request, version=version, timeout_s=None, priority=request.priority)
        # The backend gets what is left of the budget once resolution and validation have spent theirs.
        remaining = timeout - (time.perf_counter() - started)
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                return await self.backend.infer(
                    request, version=version, timeout_s=remaining, priority=request.priority
                )
        except TimeoutError:
            raise DeadlineExceeded(
                f"request to model '{request.model}' did not finish within its {timeout * 1e3:.1f} ms deadline"
            ) from None

    @staticmethod
    def _select(request: InferRequest, response: InferResponse) -> list[InferOutput]:
        if request.outputs is None:
            return response.outputs
        by_name = {output.name: output for output in response.outputs}
        return [by_name[name] for name in request.outputs]
