"""Fixtures for the local-Triton tests: a real exporter repository and a real tritonserver on free ports.

Without an install (``make install``) the server tests are skipped, except under ``CI`` where that is
a failure: CI must run them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import onnxruntime as ort
import pytest

from examples import models
from exporter import export
from services.tritonlocal import LocalTriton, TritonInstall
from tests.tritonlocal.support import Array, Reference, require_install

MODELS = ("classifier", "mlp", "mlp_ts")


@pytest.fixture(scope="session")
def install() -> TritonInstall:
    return require_install()


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """classifier and mlp as ONNX versions 1 and 2 (policy ``all``), mlp_ts as TorchScript version 1."""
    root = tmp_path_factory.mktemp("model_repository")
    for build in (models.build_classifier, models.build_classifier_v2):
        export(build(), models.classifier_inputs(2), name="classifier", repository=root, version_policy="all",
               input_names=["image"])
    for build in (models.build_mlp, models.build_mlp_v2):
        export(build(), models.mlp_inputs(2), name="mlp", repository=root, version_policy="all",
               input_names=["features"])
    export(models.build_mlp(), models.mlp_inputs(2), name="mlp_ts", repository=root, format="torchscript")
    return root


@pytest.fixture(scope="session")
def triton(install: TritonInstall, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """One server for the session with every model loaded (all versions) over gRPC."""
    work = tmp_path_factory.mktemp("triton")
    server = LocalTriton(repository, derived=work / "derived", install=install, log_file=work / "tritonserver.log")
    started = time.monotonic()
    with server:
        ready_s = time.monotonic() - started
        for model in MODELS:
            server.load(model)
        print(f"tritonserver ready in {ready_s:.2f} s, models loaded after {time.monotonic() - started:.2f} s")
        yield server


@pytest.fixture(scope="session")
def reference(repository: Path) -> Reference:
    """Runs a version's model.onnx with onnxruntime in this process: what Triton must answer."""
    sessions: dict[tuple[str, int], ort.InferenceSession] = {}

    def run(model: str, version: int, inputs: dict[str, Array]) -> dict[str, Array]:
        if (model, version) not in sessions:
            path = repository / model / str(version) / "model.onnx"
            sessions[model, version] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        session = sessions[model, version]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, inputs), strict=True))

    return run
