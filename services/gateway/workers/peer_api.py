"""What a worker answers on its Unix socket: the node's internal calls (``/peer/...``: its own figures, its share of
a version action) and, on worker 0, the admin calls the other workers forward. Every worker serves one app on both
its TCP port and its socket; ``/peer/`` paths are answered only on the socket (uvicorn gives a Unix socket's requests
no port), which only the node's processes reach: it lies in the node's folder, mode 0700."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError
from services.gateway.repository_api import RepositoryApi
from services.gateway.state import RoutingRecord
from services.gateway.tensors.types import VersionState
from services.gateway.versions.manager import VersionManager
from services.gateway.versions.progress import Progress, Steps
from services.gateway.versions.replicas import adopt
from services.gateway.workers.figures import PID_HEADER
from services.gateway.workers.kept import KeptFigures
from services.gateway.workers.kept_statistics import KeptStatistics, report_json
from services.gateway.workers.regions import region_json

log = logging.getLogger(__name__)
PREFIX = "/peer/"


class PeerApi:
    """An ASGI app: ``/peer/...`` here, anything else to ``gateway`` (the worker's own app)."""

    def __init__(
        self, gateway: ASGIApp, dataplane: DataPlane, manager: VersionManager, repository: RepositoryApi,
        kept: KeptFigures, kept_statistics: KeptStatistics,
    ) -> None:
        self._gateway = gateway
        self._kept = kept
        self._kept_statistics = kept_statistics
        self._dataplane = dataplane
        self._manager = manager
        self._repository = repository
        self.lane = getattr(gateway, "lane", None)
        """The fast inference path the HTTP protocol starts directly (``server.uvicorn_config`` reads it)."""
        self._routes = {
            ("GET", "/peer/metrics"): self._metrics,
            ("GET", "/peer/statistics"): self._statistics,
            ("GET", "/peer/ready"): self._ready,
            ("GET", "/peer/routing"): self._routing,
            ("POST", "/peer/prepare"): self._prepare,
            ("POST", "/peer/discard"): self._discard,
            ("POST", "/peer/follow"): self._follow,
            ("POST", "/peer/repository"): self._repository_action,
            ("GET", "/peer/regions"): self._regions,
            ("POST", "/peer/regions/register"): self._adopt_region,
            ("POST", "/peer/regions/forget"): self._forget_region,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(PREFIX) or not _on_unix_socket(scope):
            await self._gateway(scope, receive, send)
            return
        handler = self._routes.get((scope["method"], path))
        if handler is None:
            response: Response = JSONResponse({"error": f"no internal route {scope['method']} {path}"}, 404)
        else:
            try:
                response = await handler(Request(scope, receive))
            except GatewayError as exc:
                response = JSONResponse({"error": str(exc)}, exc.status)
        await response(scope, receive, send)

    async def _metrics(self, request: Request) -> Response:
        """This process's figures, kept first: should it die, the node goes on counting what it reported."""
        text = generate_latest(self._dataplane.metrics.registry)
        await asyncio.to_thread(self._kept.keep, text.decode())
        headers = {PID_HEADER: str(self._kept.pid)}
        return Response(text, media_type=CONTENT_TYPE_LATEST, headers=headers)

    async def _statistics(self, request: Request) -> Response:
        """This process's statistics of every ready version (the worker that asked takes what its client asked
        for), kept first: should it die, the node goes on counting what it reported."""
        report = report_json(await self._dataplane.statistics_here("", None))  # an error: left out, by its last report
        await asyncio.to_thread(self._kept_statistics.keep_report, report)
        return JSONResponse(report, headers={PID_HEADER: str(self._kept_statistics.pid)})

    async def _ready(self, request: Request) -> Response:
        ready = await self._dataplane.ready_here()
        return JSONResponse({"ready": ready}, 200 if ready else 503)

    async def _routing(self, request: Request) -> Response:
        records = self._manager.router.records
        return JSONResponse({"models": {model: record.to_json() for model, record in records.items()}})

    async def _prepare(self, request: Request) -> Response:
        """Load and warm ``version`` here; on a server the node shares (Triton) worker 0 loaded it there, and this
        worker only takes it into its view (a second load would make Triton reload it)."""
        model, version = await _model_version(request)
        manager = self._manager
        steps = Steps(model, manager.metrics, Progress("prepare", version))
        async with manager.lock(model):
            if manager.backend.shared_server:
                async with steps.run("adopt"):  # what it serves stays wanted until the routing says otherwise
                    await manager.backend.adopt(model, set(manager.loaded_now(model, plus={version})))
            else:
                await manager.prepare(model, version, steps)
        return JSONResponse({"steps": steps.progress.steps})

    async def _discard(self, request: Request) -> Response:
        model, version = await _model_version(request)
        manager = self._manager
        if manager.backend.shared_server:  # worker 0 unloads it from the server the node shares
            return JSONResponse({})
        async with manager.lock(model):
            record = manager.router.record(model)
            named = set() if record is None else {
                record.stable, record.canary and record.canary.version, record.shadow and record.shadow.version}
            if version not in named and manager.backend.state(model, version) is VersionState.READY:
                await manager.quietly(manager.backend.unload(model, version), f"unloading version {version}")
        return JSONResponse({})

    async def _follow(self, request: Request) -> Response:
        body = json.loads(await request.body())
        model, record = str(body["model"]), RoutingRecord.from_json(body["record"])
        started = time.perf_counter()
        problem = await adopt(self._manager, model, record)
        if problem is not None:
            return JSONResponse({"error": problem}, 503)
        return JSONResponse({"steps": {"follow": round(time.perf_counter() - started, 6)}})


    async def _repository_action(self, request: Request) -> Response:
        """A repository load or unload a gRPC client asked another worker for (checked there)."""
        body = json.loads(await request.body())
        report = await self._repository.run(str(body["kind"]), str(body["model"]), body.get("override"),
                                            str(body["actor"]))
        return JSONResponse(report.to_json())


    async def _regions(self, request: Request) -> Response:
        return JSONResponse({"regions": [region_json(region) for region in self._dataplane.regions.all()]})

    async def _adopt_region(self, request: Request) -> Response:
        held = json.loads(await request.body())
        self._dataplane.regions.adopt(str(held["tenant"]), str(held["name"]), str(held["key"]), int(held["offset"]),
                                      int(held["byte_size"]), held.get("remote_name"))
        return JSONResponse({})

    async def _forget_region(self, request: Request) -> Response:
        held = json.loads(await request.body())
        self._dataplane.regions.forget(str(held["tenant"]), str(held["name"]))
        return JSONResponse({})


async def _model_version(request: Request) -> tuple[str, int]:
    body: dict[str, Any] = json.loads(await request.body())
    return str(body["model"]), int(body["version"])


def _on_unix_socket(scope: Scope) -> bool:
    """uvicorn names a Unix socket's server ``(path, None)`` (older versions: no server at all); TCP has a port."""
    server = scope.get("server")
    return server is None or server[1] is None
