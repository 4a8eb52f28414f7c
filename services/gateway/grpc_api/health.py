"""The standard gRPC health service (``grpc.health.v1.Health``): what Kubernetes' gRPC probes, Envoy and gRPC load
balancers ask, answered from the data plane's readiness.

Service names: ``""`` and ``inference.GRPCInferenceService`` are the gateway (``DataPlane.ready``); a model's name
is that model (its unversioned readiness, behind the API key when metadata is protected); any other name is
NOT_FOUND on ``Check`` and SERVICE_UNKNOWN on ``Watch``, as the health protocol says. Triton answers SERVING for
every name and has no ``Watch``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError, ModelNotFound
from services.gateway.grpc_api.servicer import status_code

SERVER_SERVICES = frozenset({"", "inference.GRPCInferenceService"})
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

_NAME_SHOWN = 128  # characters of an unknown service name repeated in the error: the client sent the rest


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # grpc_health ships no py.typed
    """``Check`` reads readiness when asked; each ``Watch`` re-reads it every ``interval_s`` (cheap: in-memory
    state the backends keep current) and sends only changes. ``close`` ends every watch with NOT_SERVING, so that
    the gateway's stop does not wait out its grace period on streams that never end by themselves."""

    def __init__(self, dataplane: DataPlane, *, interval_s: float, max_watches: int) -> None:
        self._dataplane = dataplane
        self._interval_s = interval_s
        self._max_watches = max_watches
        self._watches = 0
        self._closing = asyncio.Event()

    def close(self) -> None:
        self._closing.set()

    async def Check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        service: str = request.service
        status = await self._status(service, context)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _unknown(service))
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        if self._watches >= self._max_watches:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self._watches} health watches are open, the gateway's limit "
                "(SWITCHYARD_GRPC_HEALTH_MAX_WATCHES): use Check, or retry later",
            )
        self._watches += 1
        try:
            sent = None
            while not self._closing.is_set():
                status = await self._status(request.service, context)
                current = SERVICE_UNKNOWN if status is None else status
                if current != sent:
                    yield health_pb2.HealthCheckResponse(status=current)
                    sent = current
                # A client that leaves cancels this task here; the gateway's stop wakes it at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self._interval_s)
            if sent != NOT_SERVING:  # the gateway stops: tell the watcher before the stream ends
                yield health_pb2.HealthCheckResponse(status=NOT_SERVING)
        finally:
            self._watches -= 1

    async def _status(self, service: str, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """SERVING or NOT_SERVING; ``None`` for a name that is neither the gateway nor a model."""
        dataplane = self._dataplane
        if service in SERVER_SERVICES:
            return SERVING if await dataplane.ready() else NOT_SERVING
        if service not in dataplane.catalog.entries:
            return None
        try:
            dataplane.shaper.authenticate_metadata(_api_key(context))
        except GatewayError as exc:  # the same key ModelReady asks for when metadata is protected
            await context.abort(status_code(exc), str(exc))
        try:
            ready = await dataplane.model_ready(service, None)
        except ModelNotFound:  # in the repository, but unloaded (no version loaded): known, and not serving
            ready = False
        return SERVING if ready else NOT_SERVING


def _api_key(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "x-api-key":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


def _unknown(service: str) -> str:
    shown = service if len(service) <= _NAME_SHOWN else service[:_NAME_SHOWN] + "..."
    return (
        f"unknown service {shown!r}: expected '' or 'inference.GRPCInferenceService' (the gateway) "
        "or the name of a model it serves"
    )
