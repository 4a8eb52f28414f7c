"""KServe v2 REST endpoints: translate HTTP to dataplane calls and back, nothing more."""

from __future__ import annotations

import logging
import time
from typing import Any

from google.protobuf import json_format
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError
from services.gateway.region_tensors import tensor_regions
from services.gateway.rest.body import check_length, read_body
from services.gateway.rest.codec import HEADER_LENGTH, decode_request, encode_response
from services.gateway.rest.messages import message_json
from services.gateway.rest.responses import JSONBytesResponse, error_response, gateway_error_response
from services.gateway.shaping.keys import ANONYMOUS
from services.gateway.types import ModelMetadata
from services.gateway.versions import parse_version

PROTOCOL = "http"
DISCONNECTED = 499
"""Counted (never sent) when the client went away before its request body arrived: nginx's code for it."""
log = logging.getLogger(__name__)


class Endpoints:
    def __init__(self, dataplane: DataPlane, *, max_body_bytes: int) -> None:
        self._dataplane = dataplane
        self._max_body = max_body_bytes

    async def server_metadata(self, request: Request) -> Response:
        return JSONBytesResponse(self._dataplane.server_metadata())

    async def live(self, request: Request) -> Response:
        return Response(status_code=200 if await self._dataplane.live() else 503)

    async def ready(self, request: Request) -> Response:
        return Response(status_code=200 if await self._dataplane.ready() else 503)

    async def model_metadata(self, request: Request) -> Response:
        self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"))
        metadata = await self._dataplane.model_metadata(*_target(request))
        return JSONBytesResponse(_metadata_json(metadata))

    async def model_ready(self, request: Request) -> Response:
        self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"))
        reason = await self._dataplane.model_readiness(*_target(request))
        if reason is None:
            return Response(status_code=200)
        return error_response(reason, 503)

    async def model_config(self, request: Request) -> Response:
        self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"))
        config = await self._dataplane.model_config(*_target(request))
        return JSONBytesResponse(json_format.MessageToDict(config, preserving_proto_field_name=True))

    async def statistics(self, request: Request) -> Response:
        """Triton's ``model_stats``, and the gateway's own hop per version under ``gateway_stats`` (a key Triton does
        not send: tritonclient returns the JSON as it is, and the gRPC message has no room for it)."""
        self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"))
        model: str = request.path_params.get("model_name", "")  # absent on /v2/models/stats: every model
        raw: str | None = request.path_params.get("model_version")
        report = await self._dataplane.statistics(model, None if raw is None else parse_version(raw))
        model_stats = [message_json(stats) for stats in report.model_stats]
        return JSONBytesResponse({"model_stats": model_stats, "gateway_stats": report.gateway_stats})

    async def infer(self, request: Request) -> Response:
        """Never raises: every failure becomes its answer here, so that no exception reaches the server (which
        would drop the keep-alive connection) and every answer is counted."""
        started = time.monotonic()
        headers = request.headers
        model_name: str = request.path_params["model_name"]
        raw_version: str | None = request.path_params.get("model_version")
        tenant = ANONYMOUS
        shaper = self._dataplane.shaper
        try:
            model_name, version = _target(request)
            check_length(request, self._max_body)
            tenant = shaper.authenticate(headers.get("x-api-key"))
            limits = await shaper.rate_limit(tenant, model_name)
            body = await read_body(request, self._max_body)
            regions = tensor_regions(self._dataplane.regions, tenant)
            infer_request, fmt = decode_request(body, headers.get(HEADER_LENGTH), model_name, version, regions)
            infer_request.tenant = tenant
            budget = shaper.deadlines.budget(infer_request.timeout_s, headers.get("x-request-timeout"), None)
            if budget is not None:
                infer_request.budget_s, infer_request.deadline = budget, started + budget
            infer_request.priority = shaper.priorities.rank(infer_request.priority, headers.get("x-priority"))
        except GatewayError as exc:
            self._dataplane.record_error(model_name, raw_version, PROTOCOL, exc, tenant)
            return gateway_error_response(exc)
        except ClientDisconnect:
            return _gone(self._dataplane, model_name, raw_version, tenant)
        try:
            response = await self._dataplane.infer(infer_request, protocol=PROTOCOL, header=headers.get)
        except GatewayError as exc:  # counted by the dataplane
            return gateway_error_response(exc)
        content, header_length = encode_response(response, fmt)
        answer_headers = {"X-Model-Version": str(response.version), **limits}
        if header_length is None:
            return Response(content, headers=answer_headers, media_type="application/json")
        answer_headers["Inference-Header-Content-Length"] = str(header_length)
        return Response(content, headers=answer_headers, media_type="application/octet-stream")

    async def metrics(self, request: Request) -> Response:
        registry = self._dataplane.metrics.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _gone(dataplane: DataPlane, model: str, version: str | None, tenant: str) -> Response:
    """The client disconnected mid-body: one debug line and a count, not a traceback (it is not our failure)."""
    log.debug("client disconnected before sending the whole request body for model '%s'", model)
    dataplane.record_error(model, version, PROTOCOL, GatewayError("client disconnected", DISCONNECTED), tenant)
    return Response(status_code=400)


def _target(request: Request) -> tuple[str, int | None]:
    """Model name and version (``None``: unversioned route) from the path."""
    model: str = request.path_params["model_name"]
    raw: str | None = request.path_params.get("model_version")
    return model, None if raw is None else parse_version(raw)


def _metadata_json(metadata: ModelMetadata) -> dict[str, Any]:
    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": metadata.served_shape(s)} for s in specs]

    return {
        "name": metadata.name,
        "versions": [str(v) for v in metadata.versions],
        "platform": metadata.platform,
        "inputs": tensors(metadata.inputs),
        "outputs": tensors(metadata.outputs),
    }
