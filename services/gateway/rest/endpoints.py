"""KServe v2 REST endpoints: translate HTTP to dataplane calls and back, nothing more."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError, ModelNotFound, PayloadTooLarge
from services.gateway.rest.codec import HEADER_LENGTH, decode_request, encode_response
from services.gateway.rest.responses import JSONBytesResponse, error_response
from services.gateway.types import ModelMetadata

PROTOCOL = "http"


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
        metadata = await self._dataplane.model_metadata(*_target(request))
        return JSONBytesResponse(_metadata_json(metadata))

    async def model_ready(self, request: Request) -> Response:
        reason = await self._dataplane.model_readiness(*_target(request))
        if reason is None:
            return Response(status_code=200)
        return error_response(reason, 503)

    async def model_config(self, request: Request) -> Response:
        config = await self._dataplane.model_config(*_target(request))
        return JSONBytesResponse(json_format.MessageToDict(config, preserving_proto_field_name=True))

    async def infer(self, request: Request) -> Response:
        model_name, version = _target(request)
        try:
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > self._max_body:
                raise PayloadTooLarge(f"request body of {length} bytes exceeds the {self._max_body} byte limit")
            body = await request.body()
            if len(body) > self._max_body:
                raise PayloadTooLarge(f"request body of {len(body)} bytes exceeds the {self._max_body} byte limit")
            infer_request, fmt = decode_request(body, request.headers.get(HEADER_LENGTH), model_name, version)
        except GatewayError as exc:
            self._dataplane.record_error(model_name, "" if version is None else str(version), PROTOCOL, exc)
            raise
        response = await self._dataplane.infer(infer_request, protocol=PROTOCOL, header=request.headers.get)
        content, header_length = encode_response(response, fmt)
        headers = {"X-Model-Version": str(response.version)}
        if header_length is None:
            return Response(content, headers=headers, media_type="application/json")
        headers["Inference-Header-Content-Length"] = str(header_length)
        return Response(content, headers=headers, media_type="application/octet-stream")

    async def metrics(self, request: Request) -> Response:
        registry = self._dataplane.metrics.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _target(request: Request) -> tuple[str, int | None]:
    """Model name and version (``None``: unversioned route) from the path."""
    model: str = request.path_params["model_name"]
    raw: str | None = request.path_params.get("model_version")
    if raw is None:
        return model, None
    if not raw.isdigit():
        raise ModelNotFound(f"model '{model}' has no version '{raw}' (versions are integers)")
    return model, int(raw)


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
