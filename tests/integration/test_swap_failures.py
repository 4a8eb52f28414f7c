"""What goes wrong during a switch leaves the serving version serving: a corrupt model file, a warm-up that
fails, a gateway SIGKILLed mid-swap; and a version exported while the gateway runs waits for an explicit call."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from examples import models
from exporter import export
from tests.gateway_process import GatewayProcess, gateway_process
from tests.swap_load import activate_under_light_load

TOKEN = "failure-test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def mlp_repository(examples: Path, target: Path) -> Path:
    shutil.copytree(examples / "mlp", target / "mlp")
    return target


def wrong_rows_graph() -> onnx.ModelProto:
    """The mlp's signature (features [b, 32] -> logits, probabilities [b, 8]) but 4 rows out per row in: it loads,
    and only running it shows the fault."""
    features = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 32])
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", 8]) for n in ("logits", "probabilities")]
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 8])
    nodes = [
        helper.make_node("Reshape", ["features", "shape"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(nodes, "wrong_rows", [features], outputs, initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def last_event(gateway: GatewayProcess) -> dict[str, object]:
    events = httpx.get(f"http://{gateway.http_url}/admin/models/mlp/events", headers=ADMIN).json()["events"]
    return dict(events[-1])


@pytest.mark.slow
async def test_activate_fails_at_load_and_serving_continues_when_the_model_file_is_corrupt(
    repository: Path, tmp_path: Path
) -> None:
    root = mlp_repository(repository, tmp_path / "repository")
    shutil.copytree(root / "mlp" / "2", root / "mlp" / "3")
    (root / "mlp" / "3" / "model.onnx").write_bytes(b"\x08\x07 this is not an onnx graph")
    with gateway_process(root, tmp_path, token=TOKEN) as gateway:
        response, answers = await activate_under_light_load(gateway.http_url, TOKEN, "mlp", 3)
        assert response.status_code == 422, response.text
        assert response.json()["step"] == "load"
        assert "version 2 keeps serving" in response.json()["error"]
        assert answers
        assert set(answers) == {200}
        event = last_event(gateway)
        assert (event["action"], event["result"], event["step"]) == ("activate", "failed", "load")
        status = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=ADMIN).json()
        assert status["routing"]["stable"] == 2


@pytest.mark.slow
async def test_activate_fails_at_warmup_and_unloads_the_version_when_its_answers_are_wrong(
    repository: Path, tmp_path: Path
) -> None:
    root = mlp_repository(repository, tmp_path / "repository")
    (root / "mlp" / "3").mkdir()
    onnx.save(wrong_rows_graph(), root / "mlp" / "3" / "model.onnx")  # no manifest: warmed with model_warmup
    with gateway_process(root, tmp_path, token=TOKEN) as gateway:
        # The policy (all) loaded version 3 at startup too: its warm-up failed, so it is unloaded, not routed.
        status = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=ADMIN).json()
        assert status["routing"]["stable"] == 2
        assert 3 not in [v["version"] for v in status["loaded"]]
        response, answers = await activate_under_light_load(gateway.http_url, TOKEN, "mlp", 3)
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["step"] == "warmup"
        assert "output 'logits' has 4 rows for a batch of 1" in body["error"]
        assert set(answers) == {200}
        assert (last_event(gateway)["step"]) == "warmup"
        status = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=ADMIN).json()
        assert status["routing"]["stable"] == 2
        assert 3 not in [v["version"] for v in status["loaded"]]


async def activate_then_kill(gateway: GatewayProcess, model: str, version: int, delay_s: float) -> None:
    """Ask for a switch and SIGKILL the gateway ``delay_s`` later, whatever step it is at."""
    async with httpx.AsyncClient(base_url=f"http://{gateway.http_url}", timeout=30.0) as http:
        task = asyncio.create_task(http.post(f"/admin/models/{model}/versions/{version}/activate", headers=ADMIN))
        await asyncio.sleep(delay_s)
        gateway.kill()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.slow
def test_restarted_gateway_serves_a_consistent_routing_when_killed_during_a_swap(
    repository: Path, tmp_path: Path
) -> None:
    root = tmp_path / "repository"
    shutil.copytree(repository / "classifier", root / "classifier")
    shutil.copytree(root / "classifier" / "1", root / "classifier" / "3")  # a version that must load and warm up
    config = root / "classifier" / "config.pbtxt"
    config.write_text(config.read_text().replace("all {\n  }", "specific {\n    versions: 2\n  }"))
    assert "versions: 2" in config.read_text()
    image = np.random.default_rng(0).standard_normal(3 * 64 * 64).tolist()
    body = {"inputs": [{"name": "image", "shape": [1, 3, 64, 64], "datatype": "FP32", "data": image}]}
    outcomes = []
    for attempt, delay_s in enumerate((0.05, 0.2, 0.4)):
        work = tmp_path / f"attempt-{attempt}"
        work.mkdir()
        with gateway_process(root, work, token=TOKEN) as gateway:
            url = f"http://{gateway.http_url}"
            with httpx.Client(timeout=30.0) as http:
                assert http.get(f"{url}/admin/models/classifier", headers=ADMIN).json()["routing"]["stable"] == 2
                started = time.monotonic()
                asyncio.run(activate_then_kill(gateway, "classifier", 3, delay_s))
                killed_after = time.monotonic() - started
                routing_file = work / "state" / "routing.json"
                persisted = json.loads(routing_file.read_text())["models"]["classifier"]  # never half written
                assert persisted["stable"] in (2, 3)
                gateway.start()
                status = http.get(f"{url}/admin/models/classifier", headers=ADMIN).json()
                assert status["routing"]["stable"] == persisted["stable"]
                answer = http.post(f"{url}/v2/models/classifier/infer", json=body)
                assert answer.status_code == 200
                assert int(answer.headers["x-model-version"]) == persisted["stable"]
                outcomes.append((round(killed_after, 2), persisted["stable"]))
    print(f"\nkilled after (s), routing after restart: {outcomes}")


@pytest.mark.slow
def test_version_exported_while_running_is_listed_after_a_scan_and_served_only_once_activated(
    repository: Path, tmp_path: Path
) -> None:
    root = mlp_repository(repository, tmp_path / "repository")
    with gateway_process(root, tmp_path, token=TOKEN) as gateway:
        url = f"http://{gateway.http_url}"
        result = export(
            models.build_mlp_v2(), {"features": models.mlp_inputs(2)}, name="mlp", repository=root, version_policy="all"
        )
        assert result.version == 3
        scan = httpx.post(f"{url}/admin/repository/scan", headers=ADMIN).json()
        assert scan["new_versions"] == {"mlp": [3]}
        status = httpx.get(f"{url}/admin/models/mlp", headers=ADMIN).json()
        assert status["available"] == [1, 2, 3]
        assert status["routing"]["stable"] == 2
        features = models.mlp_inputs(1, seed=2).numpy().ravel().tolist()
        body = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=body).headers["x-model-version"] == "2"
        assert httpx.post(f"{url}/v2/models/mlp/versions/3/infer", json=body).status_code == 404
        activated = httpx.post(f"{url}/admin/models/mlp/versions/3/activate", headers=ADMIN, timeout=60.0)
        assert activated.status_code == 200, activated.text
        assert httpx.post(f"{url}/v2/models/mlp/infer", json=body).headers["x-model-version"] == "3"
