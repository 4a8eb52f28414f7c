"""``ModelInfer`` with a server span per call (``tracing`` on): the servicer's own method, wrapped, so that with
tracing off a call carries no trace of it. The caller's ``traceparent`` metadata is the span's parent; the answer's
initial metadata carries the span's own."""

from __future__ import annotations

from typing import Any

import grpc

from services.gateway.dataplane import DataPlane
from services.gateway.grpc_api.cancelled import PROTOCOL
from services.gateway.grpc_api.servicer import InferenceServicer, _Metadata
from services.gateway.grpc_api.stream import StreamService
from services.gateway.repository_api import RepositoryApi
from services.gateway.tracing.spans import CURRENT, Tracing

SPAN_NAME = "inference.GRPCInferenceService/ModelInfer"


class TracedInferenceServicer(InferenceServicer):
    def __init__(
        self, dataplane: DataPlane, *, repository: RepositoryApi, streams: StreamService, tracing: Tracing
    ) -> None:
        super().__init__(dataplane, repository=repository, streams=streams)
        self._tracing = tracing

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        attributes = {"switchyard.model": request.model_name, "switchyard.protocol": PROTOCOL}
        trace = self._tracing.server(SPAN_NAME, _Metadata(context).get, attributes)
        token = CURRENT.set(trace)
        try:
            await context.send_initial_metadata((("traceparent", trace.traceparent),))
            return await super().ModelInfer(request, context)
        finally:
            CURRENT.reset(token)
            trace.end()
