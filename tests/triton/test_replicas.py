"""Two gateway replicas in front of one Triton, sharing routing through Redis: the replica that runs an action
drives Triton, the other adopts what Triton serves (and never loads back what the first unloaded)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from examples import models
from services.tritonlocal import TritonInstall
from tests.gateway_process import GatewayProcess, gateway_process
from tests.redis_server import redis_server
from tests.triton.support import local_triton
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # a local Triton

TOKEN = "triton-replica-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def routed(gateway: GatewayProcess) -> int:
    status = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=ADMIN).json()
    return int(status["routing"]["stable"])


def answered_by(gateway: GatewayProcess) -> str:
    features = models.mlp_inputs(1, seed=8).numpy().ravel().tolist()
    body = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}
    answer = httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", json=body)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-model-version"]


def wait(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    assert wait_until(condition, timeout_s)


def test_one_replica_drives_triton_and_the_other_follows_when_they_share_routing(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    source = tmp_path / "repository"
    shutil.copytree(repository / "mlp", source / "mlp")
    with local_triton(source, tmp_path, install) as server, redis_server(tmp_path / "redis") as redis:
        options = ("--backend", "triton", "--triton-local-cpu", "--triton-url", server.grpc_url)
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with gateway_process(source, tmp_path / "a", token=TOKEN, options=options, redis_url=redis.url) as a, \
                gateway_process(source, tmp_path / "b", token=TOKEN, options=options, redis_url=redis.url) as b:
            assert routed(a) == routed(b) == 2
            switched = httpx.post(f"http://{a.http_url}/admin/models/mlp/versions/1/activate", headers=ADMIN,
                                  json={"keep_previous": False}, timeout=60.0)
            assert switched.status_code == 200, switched.text
            assert switched.json()["unloaded"] == [2]
            wait(lambda: routed(b) == 1)
            assert answered_by(b) == answered_by(a) == "1"
            time.sleep(1.5)  # several health probes of B: it must not load version 2 back into Triton
            assert {v: s for v, s in server.model_states("mlp").items() if s == "READY"} == {1: "READY"}

            back = httpx.post(f"http://{b.http_url}/admin/models/mlp/rollback", headers=ADMIN, timeout=60.0)
            assert back.status_code == 200, back.text  # B drives Triton now: it loads version 2 again
            wait(lambda: routed(a) == 2)
            assert answered_by(a) == answered_by(b) == "2"
            assert server.model_states("mlp") == {1: "READY", 2: "READY"}
