"""KServe v2 REST endpoints besides inference (``lane`` answers that): translate HTTP to dataplane calls and back."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from starlette.requests import Request
from starlette.responses import Response

from services.gateway.dataplane import DataPlane
from services.gateway.rest.messages import message_json
from services.gateway.rest.responses import JSONBytesResponse
from services.gateway.tensors.types import ModelMetadata
from services.gateway.versions.numbers import parse_version


class Endpoints:
    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    async def server_metadata(self, request: Request) -> Response:
        """The v2 body, and ``grpc_port`` when gRPC serves: the bound port (a load generator or client finds it
        from the HTTP URL alone). Clients of the v2 body ignore a key they do not know (tritonclient returns the JSON
        as it is, KServe's model drops extra keys); the gRPC message has no room for it, and needs none."""
        metadata = self._dataplane.server_metadata()
        grpc_port: int | None = request.app.state.grpc_port  # set by the lifespan once the gRPC server is bound
        return JSONBytesResponse(metadata if grpc_port is None else {**metadata, "grpc_port": grpc_port})

    # The health answers carry the KServe v2 bodies (``{"live": bool}``, ``{"ready": bool}``, the model's
    # ``{"name", "ready"}``), which KServe's clients parse; Triton's clients read only the status, which stays.
    async def live(self, request: Request) -> Response:
        live = await self._dataplane.live()
        return JSONBytesResponse({"live": live}, status_code=200 if live else 503)

    async def ready(self, request: Request) -> Response:
        ready = await self._dataplane.ready()
        return JSONBytesResponse({"ready": ready}, status_code=200 if ready else 503)

    async def model_metadata(self, request: Request) -> Response:
        model, version = _target(request)
        self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"), model)
        metadata = await self._dataplane.model_metadata(model, version)
        return JSONBytesResponse(_metadata_json(metadata))

    async def model_ready(self, request: Request) -> Response:
        model, version = _target(request)
        self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"), model)
        reason = await self._dataplane.model_readiness(model, version)
        if reason is None:
            return JSONBytesResponse({"name": model, "ready": True})
        # The v2 error key beside the model's answer: clients that read errors find why it is not ready.
        return JSONBytesResponse({"name": model, "ready": False, "error": reason}, status_code=503)

    async def model_config(self, request: Request) -> Response:
        model, version = _target(request)
        self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"), model)
        config = await self._dataplane.model_config(model, version)
        return JSONBytesResponse(json_format.MessageToDict(config, preserving_proto_field_name=True))

    async def statistics(self, request: Request) -> Response:
        """Triton's ``model_stats``, and the gateway's own hop per version under ``gateway_stats`` (a key Triton does
        not send: tritonclient returns the JSON as it is, and the gRPC message has no room for it)."""
        model: str = request.path_params.get("model_name", "")  # absent on /v2/models/stats: every model
        visible = self._dataplane.shaper.authenticate_metadata(request.headers.get("x-api-key"), model)
        raw: str | None = request.path_params.get("model_version")
        report = await self._dataplane.statistics(model, None if raw is None else parse_version(raw))
        model_stats = [message_json(stats) for stats in report.model_stats if visible(stats.name)]
        gateway_stats = [hop for hop in report.gateway_stats if visible(hop["name"])]
        return JSONBytesResponse({"model_stats": model_stats, "gateway_stats": gateway_stats})

    async def metrics(self, request: Request) -> Response:
        """This process's series; with several workers the node's (``?workers=each``: each worker's, labelled).
        A scraper that accepts OpenMetrics (Prometheus does) gets it, with the latency histograms' exemplars: the
        trace ids of recorded requests. The node's merged answer is Prometheus text (merging adds samples up; an
        exemplar belongs to one worker's sample)."""
        node = self._dataplane.node
        registry = self._dataplane.metrics.registry
        if node is None and OPENMETRICS in request.headers.get("accept", ""):
            return Response(openmetrics_latest(registry), media_type=OPENMETRICS_TYPE)  # type: ignore[no-untyped-call]
        local = generate_latest(registry)
        if node is None:
            return Response(local, media_type=CONTENT_TYPE_LATEST)
        merged = await node.metrics(local.decode(), per_worker=request.query_params.get("workers") == "each")
        return Response(merged, media_type=CONTENT_TYPE_LATEST)


OPENMETRICS = "application/openmetrics-text"


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
