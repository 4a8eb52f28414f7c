"""Runs the gateway on real ports in a background thread (tests, notebooks, benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from services.gateway.app import create_app
from services.gateway.backends.triton import ConfigTransform
from services.gateway.server import uvicorn_config
from services.gateway.settings import Settings
from services.gateway.tensors.types import Array
from services.modelrepo import layout
from services.modelrepo.config import read_config
from tests.slow_work import slow_work

Reference = Callable[[str, int, dict[str, Array]], dict[str, Array]]
T = TypeVar("T")


@dataclass(frozen=True)
class RunningGateway:
    app: FastAPI
    registry: CollectorRegistry
    http_port: int
    grpc_port: int
    loop: asyncio.AbstractEventLoop | None = None
    """The event loop the gateway runs on (its own thread)."""

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def metric(self, name: str, **labels: str) -> float:
        """A sample from the gateway's registry; 0 when the series does not exist yet."""
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` on the gateway's own event loop, where its dataplane, manager and backend live (their
        asyncio and grpc.aio objects belong to that loop)."""
        assert self.loop is not None, "running_gateway() sets the loop"
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))


@contextmanager
def running_gateway(
    settings: Settings, *, config_transform: ConfigTransform | None = None, startup_timeout_s: float = 120.0
) -> Iterator[RunningGateway]:
    """Start uvicorn (uvloop + httptools, as ``switchyard serve``) on its own thread and event loop;
    port 0 in ``settings`` picks free ports. Without a ``state_path`` the routing state lives in a temporary folder
    removed on exit (a fresh routing each time). Stops the server on exit."""
    with contextlib.ExitStack() as stack:
        if settings.state_path is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="switchyard-state-")))
            settings = settings.model_copy(update={"state_path": folder / "routing.json"})
        yield from _serve(settings, config_transform, startup_timeout_s)


def _serve(
    settings: Settings, config_transform: ConfigTransform | None, startup_timeout_s: float
) -> Iterator[RunningGateway]:
    slow_work("starts a gateway on real ports")
    registry = CollectorRegistry()
    app = create_app(settings, registry=registry, config_transform=config_transform)
    config = uvicorn_config(settings, app, log_level="warning", tls=app.state.tls)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="switchyard-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the gateway did not start (see its log above)")
        time.sleep(0.05)
    http_port = int(server.servers[0].sockets[0].getsockname()[1])
    try:
        loop = server.servers[0].get_loop()
        yield RunningGateway(app, registry, http_port, int(app.state.grpc_port or 0), loop)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def onnx_reference(repository: Path) -> Reference:
    """Runs a version's ``model.onnx`` with onnxruntime directly: what a server must answer for it."""
    sessions: dict[tuple[str, int], Any] = {}

    def run(model: str, version: int, inputs: dict[str, Array]) -> dict[str, Array]:
        if (model, version) not in sessions:
            model_dir = repository / model
            path = layout.model_path(model_dir, version, read_config(model_dir))
            sessions[model, version] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        session = sessions[model, version]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, inputs), strict=True))

    return run
