"""Which version becomes stable when no routing state names one: the highest released version the policy selects,
else the latest released one, else none; an unreleased export is never made live by a start."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import CONFIG, ScriptedBackend, double_repository

from services.gateway.app import create_app
from services.gateway.repository import read_entry
from services.gateway.settings import Settings
from services.gateway.tensors.types import VersionState
from services.gateway.versions.first_stable import first_stable
from services.modelrepo.layout import MANIFEST_FILE, SAMPLE_INPUTS_FILE, SAMPLE_OUTPUTS_FILE, SAMPLES_DIR
from services.modelrepo.manifest import Manifest, TensorEntry

ADMIN = {"Authorization": "Bearer s3cret-admin-token"}
POLICY = "version_policy { specific { versions: [ 1 ] } }"


def repository(root: Path, policy: str, unreleased: set[int], versions: tuple[int, ...] = (1, 2, 3)) -> Path:
    """``double`` with ``versions`` on disk under ``policy``; the ``unreleased`` ones carry the exporter's
    ``"released": false``, the others no manifest (put there by hand: released)."""
    double_repository(root, versions)
    (root / "double" / "config.pbtxt").write_text(CONFIG.replace(POLICY, policy))
    for version in unreleased:
        write_manifest(root / "double" / str(version), version)
    return root


def write_manifest(version_dir: Path, version: int) -> None:
    """What the exporter writes for an unreleased version: the manifest and the samples its warm-up runs."""
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    (version_dir / SAMPLES_DIR).mkdir()
    np.savez(version_dir / SAMPLE_INPUTS_FILE, x=x)
    np.savez(version_dir / SAMPLE_OUTPUTS_FILE, y=2 * x, z=-x)
    tensors = [TensorEntry(name, "FP32", [4]) for name in ("x", "y", "z")]
    manifest = Manifest(name="double", version=version, format="onnx", platform="onnxruntime_onnx",
                        artifact="model.onnx", exporter="test", max_batch_size=8, inputs=tensors[:1],
                        outputs=tensors[1:], files={}, toolchain={}, parity={}, released=False)
    (version_dir / MANIFEST_FILE).write_text(manifest.to_json())


@pytest.mark.parametrize(
    ("policy", "unreleased", "candidates", "rule"),
    [
        ("version_policy { all { } }", {3}, (1, 2),
         "the highest released version the version policy selects (version 3 is not released: activate to serve)"),
        ("version_policy { all { } }", set(), (1, 2, 3), "the highest released version the version policy selects"),
        ("version_policy { latest { num_versions: 1 } }", {3}, (2,),
         "the latest released version, beside the policy's version 3 (not released: activate to serve)"),
        ("version_policy { all { } }", {1, 2, 3}, (),
         "no version of it is released (versions 1, 2, 3): activate one to serve unversioned requests"),
    ],
)
def test_first_stable_picks_among_released_versions_and_says_which_rule_chose(
    tmp_path: Path, policy: str, unreleased: set[int], candidates: tuple[int, ...], rule: str
) -> None:
    entry = read_entry(repository(tmp_path, policy, unreleased) / "double")
    choice = first_stable(entry)
    assert (choice.candidates, choice.rule) == (candidates, rule)
    assert choice.pick(lambda v: v != max(candidates, default=0)) == (max(candidates[:-1]) if candidates[1:] else
                                                                      max(candidates, default=None))


def test_a_manifest_without_the_flag_or_unreadable_counts_as_released(tmp_path: Path) -> None:
    root = repository(tmp_path, "version_policy { all { } }", set())
    (root / "double" / "1" / MANIFEST_FILE).write_text(json.dumps({"name": "double", "version": 1}))
    (root / "double" / "2" / MANIFEST_FILE).write_text("{not json")
    assert read_entry(root / "double").released == (1, 2, 3)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        repository=repository(tmp_path / "repository", "version_policy { all { } }", {3}),
        state_path=tmp_path / "state" / "routing.json",
        grpc_port=None,
        repository_poll_s=0,
        admin_token="s3cret-admin-token",  # type: ignore[arg-type]
    )


async def started(settings: Settings, backend: ScriptedBackend) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


def all_ready() -> ScriptedBackend:
    return ScriptedBackend(states=dict.fromkeys((1, 2, 3), VersionState.READY))


async def test_first_boot_serves_the_released_version_not_the_newer_unreleased_export(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="services.gateway.versions.startup")
    async for client in started(settings, all_ready()):
        answer = await client.post("/v2/models/double/infer", json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        assert answer.headers["x-model-version"] == "2"
        pinned = await client.post("/v2/models/double/versions/3/infer", json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        assert pinned.status_code == 200  # loaded (the policy selects it), served only when asked by number
        status = (await client.get("/admin/models/double", headers=ADMIN)).json()
        assert (status["available"], status["unreleased"]) == ([1, 2, 3], [3])
        events = (await client.get("/admin/models/double/events", headers=ADMIN)).json()["events"]
        assert events[-1]["detail"]["rule"].startswith("the highest released version the version policy selects")
        activated = await client.post("/admin/models/double/versions/3/activate", headers=ADMIN)
        assert activated.json()["routing"]["stable"] == 3
    said = [r.getMessage() for r in caplog.records if "stable version" in r.getMessage()]
    assert said == ["model 'double': no routing state; stable version 2, the highest released version the version "
                    "policy selects (version 3 is not released: activate to serve)"]
    caplog.clear()
    async for client in started(settings, all_ready()):  # the state the activation wrote wins over the rule
        assert (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"]["stable"] == 3
    assert [r.getMessage() for r in caplog.records if "stable version" in r.getMessage()] == [
        "model 'double': stable version 3, from the persisted routing (generation 2)"]


async def test_a_model_with_no_released_version_loads_serves_by_number_and_says_why_it_has_no_stable_one(
    tmp_path: Path,
) -> None:
    settings = Settings(repository=repository(tmp_path / "repository", "version_policy { all { } }", {1, 2, 3}),
                        state_path=tmp_path / "routing.json", grpc_port=None, repository_poll_s=0)
    async for client in started(settings, all_ready()):
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        unversioned = await client.post("/v2/models/double/infer", json=body)
        assert unversioned.status_code == 503
        assert "no version of it is released (versions 1, 2, 3): activate one" in unversioned.json()["error"]
        assert (await client.post("/v2/models/double/versions/1/infer", json=body)).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200  # settled: waiting will not change it
