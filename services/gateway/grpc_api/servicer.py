"""KServe v2 ``GRPCInferenceService`` over the dataplane; the one place gateway errors become gRPC codes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError, ModelNotFound
from services.gateway.grpc_api.codec import decode_request, encode_metadata, encode_response, parse_version

log = logging.getLogger(__name__)
PROTOCOL = "grpc"
T = TypeVar("T")

STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(error: GatewayError) -> grpc.StatusCode:
    return STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Methods not overridden here (shared memory, statistics, ...) answer UNIMPLEMENTED."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return service_pb2.ServerLiveResponse(live=await self._dataplane.live())

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return service_pb2.ServerReadyResponse(ready=await self._dataplane.ready())

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            version = parse_version(request.name, request.version)
            ready = await self._dataplane.model_ready(request.name, version)
        except ModelNotFound:  # Triton answers ready=false here rather than an error
            ready = False
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        meta = self._dataplane.server_metadata()
        return service_pb2.ServerMetadataResponse(
            name=str(meta["name"]),
            version=str(meta["version"]),
            extensions=list(meta["extensions"]),  # type: ignore[call-overload]
        )

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def call() -> Any:
            version = parse_version(request.name, request.version)
            return encode_metadata(await self._dataplane.model_metadata(request.name, version))

        return await _guard(context, call)

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def call() -> Any:
            version = parse_version(request.name, request.version)
            config = await self._dataplane.model_config(request.name, version)
            return service_pb2.ModelConfigResponse(config=config)

        return await _guard(context, call)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def call() -> Any:
            try:
                decoded = decode_request(request)
            except GatewayError as exc:
                self._dataplane.record_error(request.model_name, request.model_version, PROTOCOL, exc)
                raise
            return encode_response(await self._dataplane.infer(decoded, protocol=PROTOCOL, header=_metadata(context)))

        return await _guard(context, call)


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> Callable[[str], str | None]:
    """The call's metadata as a header lookup, read only when a sticky canary asks for it."""

    def lookup(name: str) -> str | None:
        for key, value in context.invocation_metadata() or ():
            if key == name:
                return str(value)
        return None

    return lookup


async def _guard(context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]) -> T:
    try:
        return await call()
    except GatewayError as exc:
        trailers = []
        if exc.retry_after_s is not None:
            trailers.append(("retry-after", str(exc.retry_after_s)))
        if exc.version is not None:
            trailers.append(("x-model-version", str(exc.version)))
        await context.abort(status_code(exc), str(exc), trailing_metadata=tuple(trailers))
    except Exception:
        log.exception("unexpected error in a gRPC call")
        await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
    raise AssertionError("unreachable: context.abort raises")
