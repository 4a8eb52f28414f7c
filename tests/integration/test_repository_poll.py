"""The gateway follows its repository: a model copied in while it runs is loaded at its policy's versions and
routed, as Triton's poll mode would; a new version of a served model is only listed."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from examples import models
from services.gateway.settings import Settings
from tests.gateway_harness import running_gateway

TOKEN = "poll-test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def mlp_request() -> dict[str, object]:
    features = models.mlp_inputs(1, seed=3).numpy().ravel().tolist()
    return {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}


@pytest.mark.slow
def test_poll_routes_a_new_model_and_only_lists_a_new_version_when_they_appear(
    repository: Path, tmp_path: Path
) -> None:
    root = tmp_path / "repository"
    shutil.copytree(repository / "classifier", root / "classifier")
    settings = Settings(repository=root, port=0, grpc_port=0, admin_token=TOKEN, repository_poll_s=0.3)  # type: ignore[arg-type]
    with running_gateway(settings) as gateway:
        url = f"http://{gateway.http_url}"
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=mlp_request()).status_code == 404
        # Copied the way an operator would: assembled beside the repository, then moved in with one rename.
        shutil.copytree(repository / "mlp", tmp_path / "incoming")
        (tmp_path / "incoming").rename(root / "mlp")
        shutil.copytree(root / "classifier" / "2", tmp_path / "v3")
        (tmp_path / "v3").rename(root / "classifier" / "3")
        deadline = time.monotonic() + 20
        while httpx.post(f"{url}/v2/models/mlp/infer", json=mlp_request()).status_code != 200:
            assert time.monotonic() < deadline, "the poll did not pick the new model up"
            time.sleep(0.2)
        answer = httpx.post(f"{url}/v2/models/mlp/infer", json=mlp_request())
        assert answer.headers["x-model-version"] == "2"  # its policy (all) loads 1 and 2; the highest is routed
        assert httpx.post(f"{url}/v2/models/mlp/versions/1/infer", json=mlp_request()).status_code == 200
        deadline = time.monotonic() + 10
        while 3 not in httpx.get(f"{url}/admin/models/classifier", headers=ADMIN).json()["available"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        status = httpx.get(f"{url}/admin/models/classifier", headers=ADMIN).json()
        assert status["routing"]["stable"] == 2
        assert 3 not in [v["version"] for v in status["loaded"]]
        events = httpx.get(f"{url}/admin/models/mlp/events", headers=ADMIN).json()["events"]
        assert events[-1]["action"] == "discover"
        assert events[-1]["actor"] == "gateway"
