"""Helpers for the Triton backend tests: the gateway in front of the local CPU Triton, Triton's own counters."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import tritonclient.grpc as grpcclient

from services.gateway import Settings
from services.gateway.backends.triton import ConfigTransform, TritonBackend
from services.gateway.repository import Catalog
from services.gateway.testing import RunningGateway, running_gateway
from services.tritonlocal import LocalTriton, TritonInstall, derive_config

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
