"""What the swap-race tests share: ``scale``, a real ONNX model written by hand (``y = x * version``, so every answer
names the version that computed it), gateways on the embedded backend driven through their lifespan, and bounded
traffic that records every answer."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from onnx import TensorProto, helper
from prometheus_client import CollectorRegistry

from services.gateway.app import create_app
from services.gateway.settings import Settings
from services.modelrepo.layout import MANIFEST_FILE, SAMPLE_INPUTS_FILE, SAMPLE_OUTPUTS_FILE, SAMPLES_DIR
from services.modelrepo.manifest import Manifest, TensorEntry

MODEL = "scale"
TOKEN = "swap-races-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
X = [1.0, 2.0, 3.0, 4.0]
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}]}
CONFIG = """
name: "scale"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy { latest { num_versions: 1 } }
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
instance_group { count: 1 kind: KIND_CPU }
"""


def write_version(
    model_dir: Path, version: int, *, factor: float | None = None, exported_at: str | None = None
) -> None:
    """Version folder ``version`` of ``scale``: ``y = x * factor`` (the version by default). Without ``exported_at``
    no manifest, as a folder put there by hand; with it, the manifest and samples the exporter writes (what the
    gateway reads of them: the model file's hash and the export time name the export)."""
    folder = model_dir / str(version)
    folder.mkdir(parents=True)
    k = float(version) if factor is None else factor
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        MODEL,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        initializer=[helper.make_tensor("k", TensorProto.FLOAT, [], [k])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "model.onnx")
    if exported_at is None:
        return
    (folder / SAMPLES_DIR).mkdir()
    x = np.array([X], dtype=np.float32)
    np.savez(folder / SAMPLE_INPUTS_FILE, x=x)
    np.savez(folder / SAMPLE_OUTPUTS_FILE, y=x * k)
    digest = hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    manifest = Manifest(name=MODEL, version=version, format="onnx", platform="onnxruntime_onnx",
                        artifact="model.onnx", exporter="test", max_batch_size=8,
                        inputs=[TensorEntry("x", "FP32", [4])], outputs=[TensorEntry("y", "FP32", [4])],
                        files={"model.onnx": digest}, toolchain={}, parity={}, created_at=exported_at, released=True)
    (folder / MANIFEST_FILE).write_text(manifest.to_json())


def scale_repository(root: Path, versions: tuple[int, ...] = (1, 2)) -> Path:
    """A repository holding ``scale`` at ``versions`` (policy: the latest one), written afresh."""
    if root.exists():
        shutil.rmtree(root)
    model_dir = root / MODEL
    model_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG)
    for version in versions:
        write_version(model_dir, version)
    return root


def settings_for(repository: Path, state: Path, **more: Any) -> Settings:
    return Settings(
        repository=repository,
        state_path=state / "routing.json",
        grpc_port=None,
        repository_poll_s=0,
        admin_token=TOKEN,  # type: ignore[arg-type]
        **more,
    )


@dataclass
class Gateway:
    app: FastAPI
    http: httpx.AsyncClient

    async def admin(self, method: str, path: str, body: object = None) -> httpx.Response:
        return await self.http.request(method, f"/admin/models/{MODEL}{path}", headers=ADMIN, json=body)

    async def status(self) -> dict[str, Any]:
        answer = await self.admin("GET", "")
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()
        return data

    async def stable(self) -> int:
        return int((await self.status())["routing"]["stable"])

    async def infer(self) -> httpx.Response:
        return await self.http.post(f"/v2/models/{MODEL}/infer", json=BODY)

    async def served(self) -> int:
        """The version that answered an unversioned request (its ``y`` is ``x`` times the version)."""
        answer = await self.infer()
        assert answer.status_code == 200, answer.text
        version = int(answer.json()["model_version"])
        assert answer.json()["outputs"][0]["data"] == [v * version for v in X]
        return version


@asynccontextmanager
async def gateway(settings: Settings) -> AsyncIterator[Gateway]:
    """The app on the embedded backend, through its lifespan (a replica of its own when ``redis_url`` is set)."""
    app = create_app(settings, registry=CollectorRegistry())
    async with LifespanManager(app, startup_timeout=60, shutdown_timeout=60) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://gateway", timeout=60
    ) as http:
        yield Gateway(app, http)


@dataclass
class Traffic:
    """Unversioned requests from a few clients until stopped (bounded by ``most`` requests each)."""

    gateways: list[Gateway]
    clients: int = 3
    most: int = 2000
    statuses: list[tuple[int, str]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def _client(self, index: int) -> None:
        target = self.gateways[index % len(self.gateways)]
        for _ in range(self.most):
            if self._stop.is_set():
                return
            answer = await target.infer()
            self.statuses.append((answer.status_code, answer.text if answer.status_code != 200 else ""))
            await asyncio.sleep(0)

    def start(self) -> Traffic:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    async def stop(self) -> list[tuple[int, str]]:
        """The failed answers (status, text)."""
        self._stop.set()
        assert self._task is not None
        await self._task
        return [(status, text) for status, text in self.statuses if status != 200]
