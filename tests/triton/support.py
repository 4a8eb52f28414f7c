"""Helpers for the Triton backend tests: the gateway in front of the local CPU Triton, Triton's own counters."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from services.gateway.backends.triton import ConfigTransform, TritonBackend
from services.gateway.repository import Catalog
from services.gateway.settings import Settings
from services.tritonlocal import LocalTriton, TritonInstall, derive_config
from tests.gateway_harness import RunningGateway, running_gateway
from tests.tritonlocal.support import sample

MODELS = ("classifier", "mlp")


def gateway_settings(triton_url: str, repository: Path, **overrides: object) -> Settings:
    """The gateway in front of the local CPU Triton, on free ports, with a quick probe for the tests."""
    values: dict[str, object] = {
        "repository": repository,
        "backend": "triton",
        "triton_url": triton_url,
        "port": 0,
        "grpc_port": 0,
        "triton_probe_interval_s": 0.2,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def local_triton(repository: Path, work: Path, install: TritonInstall) -> LocalTriton:
    """Free ports, picked once: a restart comes back on the same ones."""
    return LocalTriton(repository, derived=work / "derived", install=install, log_file=work / "tritonserver.log")


def statistics(server: LocalTriton, model: str, version: int, *, at_least: int = 0) -> dict[str, int]:
    """Triton's own counters for one version: inference_count (rows), execution_count (batches), fail.

    Triton counts a batch just after answering it: ``at_least`` waits (up to 2 s) until inference_count
    has caught up with the rows the caller knows were answered."""
    deadline = time.monotonic() + 2.0
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        while True:
            stats = client.get_inference_statistics(model, str(version), as_json=True)["model_stats"][0]
            counts = {
                "inference_count": int(stats.get("inference_count", 0)),
                "execution_count": int(stats.get("execution_count", 0)),
                "fail": int(stats["inference_stats"].get("fail", {}).get("count", 0)),
            }
            if counts["inference_count"] >= at_least or time.monotonic() > deadline:
                return counts
            time.sleep(0.02)


@contextmanager
def local_gateway(settings: Settings) -> Iterator[RunningGateway]:
    """The gateway on real ports, loading each model's python-backend twin as ``--triton-local-cpu`` does."""
    with running_gateway(settings, config_transform=derive_config) as running:
        yield running


async def started_backend(
    repository: Path, settings: Settings, *, transform: ConfigTransform = derive_config
) -> TritonBackend:
    """The Triton backend on its own, loading what the version policies select (the version manager's startup)."""
    catalog = Catalog(repository)
    catalog.scan()
    backend = TritonBackend(catalog, settings, transform=transform)
    await backend.start({name: entry.selected for name, entry in catalog.entries.items() if entry.available})
    return backend


async def wait_for_queue(server: LocalTriton, model: str, pending: int) -> None:
    """Until Triton reports ``pending`` requests of version 1 waiting in its queue (its own gauge)."""
    series = f'nv_inference_pending_request_count{{model="{model}",version="1"}}'
    deadline = time.monotonic() + 10.0
    async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
        while time.monotonic() < deadline:
            for line in (await client.get(server.metrics_url)).text.splitlines():
                if line.startswith(series) and float(line.split()[-1]) >= pending:
                    return
            await asyncio.sleep(0.01)
    raise AssertionError(f"Triton never queued {pending} requests of {model}")


class TcpRelay:
    """Forwards connections on a free local port to ``target`` until ``cut()``, which closes the listener and every
    relayed connection: the model server's HTTP front end vanishing under the gateway, with nothing mocked."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        self._cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@asynccontextmanager
async def classifier_queue_flooded(server: LocalTriton, *, batches: int, queued: int) -> AsyncIterator[None]:
    """``batches`` full 32-row classifier batches sent straight to Triton's version 1, and ``queued`` of them seen
    waiting in its queue before the body runs: a request sent then waits far beyond a ~100 ms budget. Awaits the
    flood on exit."""
    direct = grpcaio.InferenceServerClient(server.grpc_url)
    batch = np.ascontiguousarray(np.resize(sample("classifier", rows=1)["image"], (32, 3, 64, 64)))

    async def full_batch() -> None:
        tensor = grpcaio.InferInput("image", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        await direct.infer("classifier", [tensor], model_version="1")

    try:
        flood = [asyncio.create_task(full_batch()) for _ in range(batches)]
        await wait_for_queue(server, "classifier", queued)
        yield
        await asyncio.gather(*flood)
    finally:
        await direct.close()
