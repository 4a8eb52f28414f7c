"""KServe v2 ``GRPCInferenceService`` over the dataplane; the one place gateway errors become gRPC codes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError, ModelNotFound, unexpected
from services.gateway.grpc_api import shared_memory
from services.gateway.grpc_api.cancelled import PROTOCOL, count_cancelled
from services.gateway.grpc_api.codec import decode_request, encode_metadata, encode_response
from services.gateway.grpc_api.repository import RepositoryService
from services.gateway.grpc_api.stream import StreamService
from services.gateway.repository_api import RepositoryApi
from services.gateway.shaping.shaper import Admitted
from services.gateway.tensors.regions import tensor_regions
from services.gateway.versions.numbers import parse_version

T = TypeVar("T")

STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,  # busy with another version action: worth a retry once it has finished
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.FAILED_PRECONDITION,  # a version failed to load or warm up: its files need fixing first
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,  # a unary call on a decoupled model, as Triton answers it
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,  # a version larger than the whole model cache: the budget, not a fault
}


def status_code(error: GatewayError) -> grpc.StatusCode:
    return STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Methods not overridden here (trace and log settings) answer UNIMPLEMENTED."""

    def __init__(self, dataplane: DataPlane, *, repository: RepositoryApi, streams: StreamService) -> None:
        self._dataplane = dataplane
        self._repository = RepositoryService(repository)
        self._streams = streams

    async def ModelStreamInfer(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        answers = self._streams.serve(request_iterator, context, _Metadata(context).get, _admission_metadata(context))
        async for answer in answers:
            yield answer

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return service_pb2.ServerLiveResponse(live=await self._dataplane.live())

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return service_pb2.ServerReadyResponse(ready=await self._dataplane.ready())

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def call() -> Any:
            self._dataplane.shaper.authenticate_metadata(_metadata(context)("x-api-key"), request.name)
            version = parse_version(request.version)  # a malformed one is INVALID_ARGUMENT
            try:
                ready = await self._dataplane.model_ready(request.name, version)
            except ModelNotFound:  # Triton answers ready=false here rather than an error
                ready = False
            return service_pb2.ModelReadyResponse(ready=ready)

        return await self._guard(request, context, call)

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        visible_models = self._dataplane.shaper.visible_models
        return await self._guard(
            request, context, lambda: self._repository.index(request, _metadata(context), visible_models)
        )

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._guard(request, context, lambda: self._repository.load(request, _metadata(context)))

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._guard(request, context, lambda: self._repository.unload(request, _metadata(context)))

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        meta = self._dataplane.server_metadata()
        return service_pb2.ServerMetadataResponse(
            name=str(meta["name"]),
            version=str(meta["version"]),
            extensions=list(meta["extensions"]),  # type: ignore[call-overload]
        )

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def call() -> Any:
            self._dataplane.shaper.authenticate_metadata(_metadata(context)("x-api-key"), request.name)
            version = parse_version(request.version)
            return encode_metadata(await self._dataplane.model_metadata(request.name, version))

        return await self._guard(request, context, call)

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async def call() -> Any:
            self._dataplane.shaper.authenticate_metadata(_metadata(context)("x-api-key"), request.name)
            version = parse_version(request.version)
            config = await self._dataplane.model_config(request.name, version)
            return service_pb2.ModelConfigResponse(config=config)

        return await self._guard(request, context, call)

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """Triton's figures only: the message has no field for the gateway's hop (the HTTP answer and /metrics do)."""

        async def call() -> Any:
            visible = self._dataplane.shaper.authenticate_metadata(_metadata(context)("x-api-key"), request.name)
            version = parse_version(request.version)
            report = await self._dataplane.statistics(request.name, version)
            shown = [stats for stats in report.model_stats if visible(stats.name)]
            return service_pb2.ModelStatisticsResponse(model_stats=shown)

        return await self._guard(request, context, call)

    async def SystemSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await _guard(
            context, lambda: shared_memory.system_status(self._dataplane.regions, self._tenant(context), request)
        )

    async def SystemSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await _guard(
            context, lambda: shared_memory.system_register(self._dataplane.regions, self._tenant(context), request)
        )

    async def SystemSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await _guard(
            context, lambda: shared_memory.system_unregister(self._dataplane.regions, self._tenant(context), request)
        )

    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._guard(request, context, lambda: shared_memory.cuda_status(request))

    async def CudaSharedMemoryRegister(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._guard(request, context, lambda: shared_memory.cuda_register(request))

    async def CudaSharedMemoryUnregister(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await self._guard(request, context, lambda: shared_memory.cuda_unregister(request))

    async def _guard(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]
    ) -> T:
        """The size check every message gets (``ModelInfer``'s is in its admission step), then the call, guarded."""

        async def checked() -> T:
            self._dataplane.shaper.check_size(request.ByteSize(), PROTOCOL)
            return await call()

        return await _guard(context, checked)

    def _tenant(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        return self._dataplane.shaper.authenticate(_metadata(context)("x-api-key"))

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.monotonic()
        dataplane = self._dataplane
        shaper = dataplane.shaper
        lookup = _Metadata(context).get
        admitted = Admitted()
        try:
            api_key, timeout, priority = _admission_metadata(context)
            size = request.ByteSize()
            await shaper.admit(admitted, request.model_name, PROTOCOL, api_key=api_key, size=size)
            decoded = decode_request(request, tensor_regions(dataplane.regions, admitted.tenant))
            remaining = context.time_remaining()
            shaper.shape(decoded, admitted, started, timeout=timeout, priority=priority, call_remaining_s=remaining)
        except GatewayError as exc:
            dataplane.record_error(request.model_name, request.model_version, PROTOCOL, exc, admitted.tenant)
            return await _abort(context, exc)
        except asyncio.CancelledError:  # while it waited for admission
            count_cancelled(dataplane, context, request.model_name, request.model_version, admitted.tenant,
                            stopping=self._streams.stopping)
            raise
        except Exception as exc:
            return await self._unexpected(context, exc, request.model_name, request.model_version, admitted.tenant)
        try:
            response = await dataplane.infer(decoded, protocol=PROTOCOL, header=lookup)
        except GatewayError as exc:  # counted by the dataplane
            return await _abort(context, exc)
        except asyncio.CancelledError:
            count_cancelled(dataplane, context, decoded.model, decoded.counted_version(), admitted.tenant,
                            stopping=self._streams.stopping)
            raise
        try:
            answer = encode_response(response)
        except Exception as exc:
            return await self._unexpected(context, exc, decoded.model, decoded.version, admitted.tenant)
        if admitted.limits:
            context.set_trailing_metadata(tuple((name.lower(), value) for name, value in admitted.limits.items()))
        return answer

    async def _unexpected(
        self, context: grpc.aio.ServicerContext[Any, Any], exc: Exception, model: str, version: Any, tenant: str
    ) -> Any:
        """A bug on the way in or out: a counted ``INTERNAL`` naming the request id its traceback is logged under."""
        error = unexpected(exc, "a gRPC ModelInfer call")
        self._dataplane.record_error(model, version, PROTOCOL, error, tenant)
        return await _abort(context, error)


class _Metadata:
    """The call's metadata as a header lookup, read only when asked (an API key, a sticky canary)."""

    __slots__ = ("_context",)

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context

    def get(self, name: str) -> str | None:
        for key, value in self._context.invocation_metadata() or ():
            if key == name:
                return str(value)
        return None


def _admission_metadata(context: grpc.aio.ServicerContext[Any, Any]) -> tuple[str | None, str | None, str | None]:
    """``x-api-key``, ``x-request-timeout`` and ``x-priority`` (the first of each) in one pass over the metadata:
    every inference call reads them, and three lookups would walk it three times."""
    api_key = timeout = priority = None
    for key, value in context.invocation_metadata() or ():
        if key == "x-api-key":
            api_key = api_key if api_key is not None else str(value)
        elif key == "x-request-timeout":
            timeout = timeout if timeout is not None else str(value)
        elif key == "x-priority":
            priority = priority if priority is not None else str(value)
    return api_key, timeout, priority


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> Callable[[str], str | None]:
    return _Metadata(context).get


async def _guard(context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]) -> T:
    """Any call but inference: its ``GatewayError`` as the matching code, a bug as ``INTERNAL`` with a request id."""
    try:
        return await call()
    except GatewayError as exc:
        await _abort(context, exc)
    except Exception as exc:
        await _abort(context, unexpected(exc, "a gRPC call"))
    raise AssertionError("unreachable: context.abort raises")


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: GatewayError) -> Any:
    """End the call with the error's code and message; what REST sends as headers goes in trailing metadata."""
    trailers = [(name.lower(), value) for name, value in error.headers.items()]
    if error.retry_after_s is not None:
        trailers.append(("retry-after", str(error.retry_after_s)))
    if error.version is not None:
        trailers.append(("x-model-version", str(error.version)))
    if error.request_id is not None:
        trailers.append(("x-request-id", error.request_id))
    await context.abort(status_code(error), str(error), trailing_metadata=tuple(trailers))
