"""The Triton backend serves a Triton repository the exporter did not write, against the real local Triton: no
manifests, a hand-written model, and a TensorRT model this CPU Triton refuses, reported with Triton's reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.tritonlocal import TritonInstall
from tests.foreign_repository import check_engine_unavailable, check_every_model_serves, make_foreign_repository
from tests.triton.support import gateway_settings, local_gateway, local_triton

pytestmark = pytest.mark.slow  # a local Triton


def test_triton_backend_serves_every_model_and_reports_the_engine_when_the_repository_is_foreign(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    foreign = make_foreign_repository(repository, tmp_path / "foreign")
    with local_triton(foreign, tmp_path, install) as server, local_gateway(
        gateway_settings(server.grpc_url, foreign)
    ) as gateway:
        check_every_model_serves(gateway, foreign)
        reason = check_engine_unavailable(gateway, "engine")
        assert "tensorrt" in reason.lower()
        assert server.model_states("addsub") == {3: "READY"}
        # A refused model is not retried by the health probe: Triton is not asked to load it again and again.
        log = (tmp_path / "tritonserver.log").read_text()
        attempts = log.count("loading: engine:1")
        time.sleep(1.0)  # five probe periods
        assert (tmp_path / "tritonserver.log").read_text().count("loading: engine:1") == attempts
