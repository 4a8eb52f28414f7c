"""One worker process of a node: the gateway app on the node's shared ports, its socket for the node's internal
calls, and a log line prefix naming it. Started by the supervisor (``supervisor.py``) with ``spawn``: a fresh
interpreter, never a fork of one that holds gRPC, onnxruntime or torch threads."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

import uvicorn
from prometheus_client import Gauge

from services.gateway.app import create_app
from services.gateway.server import check_fd_limit, uvicorn_config
from services.gateway.workers.forwarding import ForwardToActingWorker
from services.gateway.workers.node import WorkerNode
from services.gateway.workers.peer_api import PeerApi
from services.gateway.workers.sockets import reuseport_socket
from services.gateway.workers.spec import WorkerSpec


def run_worker(spec: WorkerSpec) -> None:
    settings, place = spec.settings, spec.place
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker {place.index} %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per call between the workers otherwise
    check_fd_limit(settings)
    node = WorkerNode(place)
    app = create_app(settings, config_transform=spec.config_transform, node=node)
    restarts = Gauge("switchyard_worker_restarts", "Times the supervisor restarted this worker (serve --workers N)",
                     registry=app.state.dataplane.metrics.registry)
    restarts.set(spec.restarts)  # the node's answer adds the workers' up
    gateway = app if place.acting else ForwardToActingWorker(app, node.peers, max_body_bytes=settings.max_body_bytes)
    served = PeerApi(gateway, app.state.dataplane, app.state.manager, app.state.repository_api, node.kept,
                     node.kept_statistics)
    server = PlainPeerSocketServer(uvicorn_config(settings, served, tls=app.state.tls), node.listen(), node.serving)
    server.run(sockets=[reuseport_socket(settings.host, settings.port)])


class PlainPeerSocketServer(uvicorn.Server):
    """uvicorn serves every socket it is handed with the config's TLS context; the worker's Unix socket carries the
    node's own calls (``peers.py``, the supervisor's readiness check) in plain HTTP, and only this worker's user can
    open it (mode 0600), so it is served here without TLS, beside the TCP port, once uvicorn's startup is done."""

    def __init__(
        self, config: uvicorn.Config, peer_socket: socket.socket, serving: Callable[[], Awaitable[None]]
    ) -> None:
        """``serving``: called once both sockets listen (``WorkerNode.serving``)."""
        super().__init__(config)
        self._peer_socket = peer_socket
        self._serving = serving

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit:  # the lifespan failed: uvicorn serves nothing
            return
        config, loop = self.config, asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        self.servers.append(await loop.create_server(protocol, sock=self._peer_socket, backlog=config.backlog))
        await self._serving()
