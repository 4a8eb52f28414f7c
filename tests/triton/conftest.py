"""Fixtures for the Triton backend tests: the example models exported once, a real local Triton (CPU,
python backend) started empty in explicit mode, and the gateway with ``backend="triton"`` in front of it.

Without a local Triton install (``make install``) these tests are skipped, except under ``CI``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from examples.export_examples import export_examples
from services.gateway import Settings
from services.gateway.testing import Reference, RunningGateway, onnx_reference, running_gateway
from services.tritonlocal import LocalTriton, TritonInstall
from tests.tritonlocal.support import require_install

MODELS = ("classifier", "mlp")


def gateway_settings(triton_url: str, repository: Path, **overrides: object) -> Settings:
    """The gateway in front of the local CPU Triton, on free ports, with a quick probe for the tests."""
    values: dict[str, object] = {
        "repository": repository,
        "backend": "triton",
        "triton_url": triton_url,
        "triton_local_cpu": True,
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


@pytest.fixture(scope="session")
def install() -> TritonInstall:
    return require_install()


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """classifier and mlp, versions 1 and 2 each (policy ``all``), exactly as ``make models`` writes them."""
    root = tmp_path_factory.mktemp("model_repository")
    export_examples(root)
    return root


@pytest.fixture(scope="session")
def reference(repository: Path) -> Reference:
    return onnx_reference(repository)


@pytest.fixture(scope="session")
def triton(install: TritonInstall, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """Started empty (explicit mode, nothing loaded): the gateway's backend loads what the policies select."""
    with local_triton(repository, tmp_path_factory.mktemp("triton"), install) as server:
        yield server


@pytest.fixture(scope="session")
def gateway(triton: LocalTriton, repository: Path) -> Iterator[RunningGateway]:
    started = time.monotonic()
    with running_gateway(gateway_settings(triton.grpc_url, repository)) as running:
        print(f"gateway (backend=triton) up with all versions loaded in {time.monotonic() - started:.1f} s")
        yield running
