"""Version actions in front of the real local Triton when things go wrong or change: a corrupt model file fails
the load step while Triton keeps serving the other versions, and a version exported while everything runs is
listed after a scan and served once activated."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from examples import models
from exporter import export
from services.tritonlocal import TritonInstall
from tests.gateway_process import gateway_process
from tests.swap_load import activate_under_light_load
from tests.triton.support import local_triton
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # a local Triton

TOKEN = "triton-failure-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def test_corrupt_version_fails_at_load_and_an_exported_one_serves_when_activated(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    source = tmp_path / "repository"
    shutil.copytree(repository / "mlp", source / "mlp")
    shutil.copytree(source / "mlp" / "2", source / "mlp" / "3")
    (source / "mlp" / "3" / "model.onnx").write_bytes(b"\x08\x07 not an onnx graph")
    options = ("--backend", "triton", "--triton-local-cpu")
    with local_triton(source, tmp_path, install) as server, gateway_process(
        source, tmp_path, token=TOKEN, options=(*options, "--triton-url", server.grpc_url)
    ) as gateway:
        server.follow(0.2)  # as `switchyard triton` does: exports reach the derived repository
        url = f"http://{gateway.http_url}"
        # The policy (all) asked for 1, 2 and 3 at startup; Triton refused 3 and serves the others.
        status = httpx.get(f"{url}/admin/models/mlp", headers=ADMIN).json()
        assert status["routing"]["stable"] == 2
        response, answers = await activate_under_light_load(gateway.http_url, TOKEN, "mlp", 3)
        assert response.status_code == 422, response.text
        assert response.json()["step"] == "load"
        assert "version 2 keeps serving" in response.json()["error"]
        assert answers
        assert set(answers) == {200}
        assert {v: s for v, s in server.model_states("mlp").items() if s == "READY"} == {1: "READY", 2: "READY"}

        result = export(
            models.build_mlp_v2(), {"features": models.mlp_inputs(2)}, name="mlp", repository=source,
            version_policy="all",
        )
        assert result.version == 4
        scan = httpx.post(f"{url}/admin/repository/scan", headers=ADMIN).json()
        assert scan["new_versions"] == {"mlp": [4]}
        # The follower's next round links version 4 into the derived repository.
        assert wait_until(lambda: (server.derived_root / "mlp" / "4").exists())
        activated = httpx.post(f"{url}/admin/models/mlp/versions/4/activate", headers=ADMIN, timeout=120.0)
        assert activated.status_code == 200, activated.text
        features = models.mlp_inputs(1, seed=2).numpy().ravel().tolist()
        body = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=body).headers["x-model-version"] == "4"
        assert server.model_states("mlp").get(4) == "READY"
