"""The routing record names which export it routes to, not only a number: a restart after the model was deleted and
exported again never puts the new, unreleased export live under the activated version's number, a normal restart
keeps the routing, and a record from before identities routes as it always did."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import CONFIG, ScriptedBackend, double_repository

from services.gateway.app import create_app
from services.gateway.settings import Settings
from services.gateway.state import RoutingRecord
from services.gateway.tensors.types import VersionState
from services.modelrepo.layout import MANIFEST_FILE, SAMPLE_INPUTS_FILE, SAMPLE_OUTPUTS_FILE, SAMPLES_DIR
from services.modelrepo.manifest import NO_MANIFEST, Manifest, TensorEntry, export_identity

ADMIN = {"Authorization": "Bearer s3cret-admin-token"}
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def export(version_dir: Path, version: int, *, released: bool, digest: str, at: str) -> None:
    """What the exporter leaves in a version folder, as far as the gateway reads it: the manifest (the artifact's
    hash, the time, the release flag) and the samples its warm-up runs."""
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.onnx").write_bytes(digest.encode())
    (version_dir / SAMPLES_DIR).mkdir(exist_ok=True)
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    np.savez(version_dir / SAMPLE_INPUTS_FILE, x=x)
    np.savez(version_dir / SAMPLE_OUTPUTS_FILE, y=2 * x, z=-x)
    tensors = [TensorEntry(name, "FP32", [4]) for name in ("x", "y", "z")]
    manifest = Manifest(name="double", version=version, format="onnx", platform="onnxruntime_onnx",
                        artifact="model.onnx", exporter="test", max_batch_size=8, inputs=tensors[:1],
                        outputs=tensors[1:], files={"model.onnx": digest * 4}, toolchain={}, parity={},
                        created_at=at, released=released)
    (version_dir / MANIFEST_FILE).write_text(manifest.to_json())


def export_twice(repository: Path, digest: str, at: str) -> None:
    """Version 1 released, version 2 not: as the exporter publishes a model's first two versions."""
    export(repository / "double" / "1", 1, released=True, digest=digest + "1", at=at)
    export(repository / "double" / "2", 2, released=False, digest=digest + "2", at=at)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    root = double_repository(tmp_path / "repository")
    (root / "double" / "config.pbtxt").write_text(CONFIG.replace("specific { versions: [ 1 ] }", "all { }"))
    export_twice(root, "a" * 15, "2026-12-01T10:00:00+00:00")
    return Settings(repository=root, state_path=tmp_path / "state" / "routing.json", grpc_port=None,
                    repository_poll_s=0, admin_token="s3cret-admin-token")  # type: ignore[arg-type]


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    backend = ScriptedBackend(states=dict.fromkeys((1, 2), VersionState.READY))
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://gateway"
    ) as http:
        yield http


async def served(client: httpx.AsyncClient) -> str:
    answer = await client.post("/v2/models/double/infer", json=BODY)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-model-version"]


async def routing(client: httpx.AsyncClient) -> dict[str, object]:
    routed: dict[str, object] = (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"]
    return routed


def persisted(settings: Settings) -> dict[str, object]:
    assert settings.state_path is not None
    record: dict[str, object] = json.loads(settings.state_path.read_text())["models"]["double"]
    return record


async def test_start_serves_the_released_version_when_the_activated_number_holds_another_export(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(settings) as client:
        activated = await client.post("/admin/models/double/versions/2/activate", headers=ADMIN)
        assert activated.json()["routing"]["stable"] == 2, activated.text
    # The model deleted and exported again: the same numbers, other exports, version 2 not released.
    export_twice(settings.repository, "b" * 15, "2026-12-02T10:00:00+00:00")
    caplog.set_level(logging.INFO, logger="services.gateway.versions.startup")
    async with serving(settings) as client:
        assert await served(client) == "1"
        assert (await routing(client))["previous"] is None  # version 1 is another export too: no rollback to it
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [
        "model 'double': the persisted stable version 2 is not the export that was activated: its files on disk are "
        "a different export (model.onnx sha256:bbbbbbbbbbbbbbb2 exported 2026-12-02T10:00:00+00:00) than the one "
        "activated (model.onnx sha256:aaaaaaaaaaaaaaa2 exported 2026-12-01T10:00:00+00:00); unversioned requests do "
        "not go to it (activate it to serve this export); dropped from the persisted routing: previous version 1, "
        "whose files on disk are a different export (model.onnx sha256:bbbbbbbbbbbbbbb1 exported "
        "2026-12-02T10:00:00+00:00) than the one that served (model.onnx sha256:aaaaaaaaaaaaaaa1 exported "
        "2026-12-01T10:00:00+00:00); serving version 1"
    ]
    assert persisted(settings)["exports"] == {
        "1": "model.onnx sha256:bbbbbbbbbbbbbbb1 exported 2026-12-02T10:00:00+00:00"}


async def test_restart_keeps_the_activated_version_when_its_export_is_unchanged(settings: Settings) -> None:
    async with serving(settings) as client:
        await client.post("/admin/models/double/versions/2/activate", headers=ADMIN)
    exports = persisted(settings)["exports"]
    assert exports == {str(v): export_identity(settings.repository / "double" / str(v)) for v in (1, 2)}
    async with serving(settings) as client:
        assert await served(client) == "2"
        assert (await routing(client))["previous"] == 1
    assert persisted(settings)["generation"] == 2  # nothing to repair: not written again


async def test_an_old_record_without_exports_routes_by_its_numbers_and_names_them_at_its_next_change(
    settings: Settings,
) -> None:
    assert settings.state_path is not None
    settings.state_path.parent.mkdir(parents=True)
    old = {k: v for k, v in RoutingRecord(stable=2, previous=1, generation=4).to_json().items() if k != "exports"}
    settings.state_path.write_text(json.dumps({"format": 1, "models": {"double": old}}))
    export_twice(settings.repository, "b" * 15, "2026-12-02T10:00:00+00:00")  # nothing to tell it by: trusted
    async with serving(settings) as client:
        assert await served(client) == "2"
        rolled = await client.post("/admin/models/double/rollback", headers=ADMIN)
        assert rolled.status_code == 200, rolled.text
    assert persisted(settings)["exports"] == {
        "1": "model.onnx sha256:bbbbbbbbbbbbbbb1 exported 2026-12-02T10:00:00+00:00",
        "2": "model.onnx sha256:bbbbbbbbbbbbbbb2 exported 2026-12-02T10:00:00+00:00",
    }


async def test_rollback_is_refused_when_the_previous_number_holds_another_export_now(settings: Settings) -> None:
    async with serving(settings) as client:
        await client.post("/admin/models/double/versions/2/activate", headers=ADMIN)
        export(settings.repository / "double" / "1", 1, released=True, digest="c" * 16, at="2026-12-03T10:00:00Z")
        refused = await client.post("/admin/models/double/rollback", headers=ADMIN)
        assert refused.status_code == 409
        assert refused.json()["error"] == (
            "model 'double' cannot roll back to version 1: its files on disk are a different export (model.onnx "
            "sha256:cccccccccccccccc exported 2026-12-03T10:00:00Z) than the one that served (model.onnx "
            "sha256:aaaaaaaaaaaaaaa1 exported 2026-12-01T10:00:00+00:00); activate it to serve this export "
            "(switchyard models activate double 1)"
        )
        assert await served(client) == "2"


def test_a_record_keeps_its_exports_through_json_as_both_stores_write_it() -> None:
    record = RoutingRecord(stable=2, previous=1, exports={2: "model.onnx sha256:ab exported t", 1: NO_MANIFEST})
    text = json.dumps(record.to_json())  # the Redis store's field; the file store nests the same object
    assert json.loads(text)["exports"] == {"1": "no manifest", "2": "model.onnx sha256:ab exported t"}
    assert RoutingRecord.from_json(json.loads(text)) == record
    with pytest.raises(ValueError, match="'exports' must map version numbers to export identities"):
        RoutingRecord.from_json({**record.to_json(), "exports": {"two": "x"}})


def test_export_identity_reads_the_manifest_only_and_names_a_folder_without_one(tmp_path: Path) -> None:
    export(tmp_path / "1", 1, released=True, digest="d" * 16, at="2026-12-04T10:00:00+00:00")
    (tmp_path / "1" / "model.onnx").write_bytes(b"not what the manifest hashed")  # not read: a start stays fast
    (tmp_path / "2").mkdir()
    assert export_identity(tmp_path / "1") == "model.onnx sha256:dddddddddddddddd exported 2026-12-04T10:00:00+00:00"
    assert export_identity(tmp_path / "2") == NO_MANIFEST


async def test_a_pinned_request_for_a_version_on_disk_but_not_loaded_says_how_to_serve_it(tmp_path: Path) -> None:
    settings = Settings(repository=double_repository(tmp_path / "repository"), state_path=tmp_path / "routing.json",
                        grpc_port=None, repository_poll_s=0)
    app = create_app(settings, backend=ScriptedBackend(), registry=CollectorRegistry())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://gateway"
    ) as client:
        on_disk = await client.post("/v2/models/double/versions/2/infer", json=BODY)
        absent = await client.post("/v2/models/double/versions/7/infer", json=BODY)
    assert on_disk.status_code == absent.status_code == 404
    assert on_disk.json()["error"] == (
        "Request for unknown model: 'double' version 2 is not found; loaded versions: 1; version 2 is in the "
        "repository but not loaded: switchyard models load double 2 (or activate it)"
    )
    assert absent.json()["error"] == "Request for unknown model: 'double' version 7 is not found; loaded versions: 1"
