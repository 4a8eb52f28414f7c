"""Helpers for the tuning tests: a gateway serving a private copy of a model with the admin API on, the
``switchyard tune`` command against it, and a watcher that records every place a trial model could leak to."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import onnx
from onnx import TensorProto, helper
from typer.testing import CliRunner, Result

from services.cli import app
from services.gateway.settings import Settings
from services.gateway.tuning.hosts import TRIAL_PREFIX
from tests.gateway_harness import RunningGateway, running_gateway

TOKEN = "tune-test-admin-token-8c1d"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
NO_ENVIRONMENT: dict[str, str | None] = {"SWITCHYARD_ADMIN_URL": None, "SWITCHYARD_ADMIN_TOKEN": None}
FEATURES = {"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}
QUICK_BUDGET_S = 16
QUICK = ["--budget-s", str(QUICK_BUDGET_S), "--duration", "0.3", "--concurrency", "1,4"]
"""A run that fits a test: 16 s in all, 0.3 s per level (0.15 s when screening), two levels. 10 s searched only two
candidates once on a loaded CI-like run (each trial's load and warm-up slow down with the machine)."""


def copy_models(source: Path, target: Path, *models: str) -> Path:
    for model in models:
        shutil.copytree(source / model, target / model)
    return target


def admin_settings(repository: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "repository": repository,
        "port": 0,
        "grpc_port": 0,
        "admin_token": TOKEN,
        "repository_poll_s": 0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@contextmanager
def embedded_gateway(repository: Path) -> Iterator[RunningGateway]:
    with running_gateway(admin_settings(repository)) as gateway:
        yield gateway


def tune(gateway: RunningGateway, *args: str, folder: Path) -> Result:
    """``switchyard tune ARGS --url ... --token ... --plot folder/pareto.png``; no traceback, no token printed."""
    options = ["--url", f"http://{gateway.http_url}", "--token", TOKEN, "--plot", str(folder / "pareto.png")]
    result = CliRunner().invoke(app, ["tune", *args, *options], env=NO_ENVIRONMENT)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert TOKEN not in result.output
    return result


def start_run(gateway: RunningGateway, model: str, **options: Any) -> httpx.Response:
    return httpx.post(f"http://{gateway.http_url}/admin/models/{model}/tune", json=options, headers=HEADERS)


def run_status(gateway: RunningGateway, model: str) -> httpx.Response:
    return httpx.get(f"http://{gateway.http_url}/admin/models/{model}/tune", headers=HEADERS)


def wait_finished(gateway: RunningGateway, model: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        run: dict[str, Any] = run_status(gateway, model).json()
        if run["status"] != "running" or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def trial_threads() -> list[str]:
    """Threads of embedded trial versions still alive in this process (each version's pool names them)."""
    return [t.name for t in threading.enumerate() if t.name.startswith(TRIAL_PREFIX)]


@dataclass
class LeakWatch:
    """Polls, while a run goes on, what clients and operators see: the v2 repository index, the model list and
    metadata, the admin overview, /metrics, and production inference on the serving model."""

    gateway: RunningGateway
    model: str
    leaks: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    polls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> LeakWatch:
        self._thread = threading.Thread(target=self._watch, name="tune-leak-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        base = f"http://{self.gateway.http_url}"
        with httpx.Client(base_url=base, timeout=10) as client:
            while not self._stop.is_set():
                seen = {
                    "repository index": client.post("/v2/repository/index", headers=HEADERS).text,
                    "admin overview": client.get("/admin/models", headers=HEADERS).text,
                    "metrics": client.get("/metrics").text,
                }
                for where, text in seen.items():
                    if TRIAL_PREFIX in text:
                        self.leaks.append(where)
                answer = client.post(f"/v2/models/{self.model}/infer", json={"inputs": [FEATURES]})
                if answer.status_code != 200:
                    self.failed_requests.append(f"{answer.status_code} {answer.text[:200]}")
                self.polls += 1
                self._stop.wait(0.1)


FIXED_BATCH = "fixed_batch"
FIXED_BATCH_CONFIG = f"""
name: "{FIXED_BATCH}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }}
output {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }}
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
"""
"""Declares batches of up to 8 rows, but its graph takes exactly 1 (an export with a fixed batch dimension): a
request alone answers, a batch of several fails. Eight clients and a 20 ms queue delay batch every request."""


def fixed_batch_model(repository: Path) -> Path:
    """``FIXED_BATCH`` version 1 (a ReLU on a [1, 4] tensor) in ``repository``."""
    folder = repository / FIXED_BATCH
    (folder / "1").mkdir(parents=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], FIXED_BATCH, [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(FIXED_BATCH_CONFIG)
    return repository
