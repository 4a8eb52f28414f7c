"""The swap protocol over a scripted backend, through the admin API: activate, rollback, load, unload, their
failures, one action per model at a time, persisted routing, audit events and metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.settings import Settings
from services.gateway.tensors.types import VersionState
from tests.waiting import eventually_async, wait_until_async

ADMIN = {"Authorization": "Bearer s3cret-admin-token"}
X = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}


@asynccontextmanager
async def serving(settings: Settings, backend: ScriptedBackend) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://g"
    ) as http:
        yield http


async def infer(client: httpx.AsyncClient, version: int | None = None) -> httpx.Response:
    path = "/v2/models/double/infer" if version is None else f"/v2/models/double/versions/{version}/infer"
    return await client.post(path, json={"inputs": [X]})


async def served_version(client: httpx.AsyncClient) -> int:
    response = await infer(client)
    assert response.status_code == 200, response.text
    return int(response.json()["model_version"])


async def admin(client: httpx.AsyncClient, path: str, body: object = None) -> httpx.Response:
    if body is None:
        return await client.post(f"/admin/models/double{path}", headers=ADMIN)
    return await client.post(f"/admin/models/double{path}", headers=ADMIN, json=body)


async def test_activate_flips_persists_and_reports_each_step_when_the_version_loads(
    client: httpx.AsyncClient, backend: ScriptedBackend, settings: Settings, registry: CollectorRegistry
) -> None:
    backend.factor[2] = 3.0
    assert await served_version(client) == 1
    response = await admin(client, "/versions/2/activate")
    assert response.status_code == 200, response.text
    report = response.json()
    assert (report["action"], report["result"], report["versions"]) == ("activate", "ok", {"from": 1, "to": 2})
    assert list(report["steps"]) == ["load", "warmup", "compare", "flip", "to_flip", "drain", "to_drained"]
    assert report["routing"]["stable"] == 2
    assert report["routing"]["previous"] == 1
    assert report["routing"]["generation"] == 2
    # Version 2 answers y = 6x where version 1 answers 2x, z alike: the seeded probe rows show it.
    comparison = report["comparison"]
    assert (comparison["against"], comparison["max_abs_diff"]["z"]) == (1, 0.0)
    assert comparison["max_abs_diff"]["y"] > 1.0
    assert report["drained"] is True
    assert report["unloaded"] == []  # keep_previous: version 1 stays loaded for an instant rollback
    assert backend.states == {1: VersionState.READY, 2: VersionState.READY}
    assert await served_version(client) == 2
    persisted = json.loads(settings.state_path.read_text())  # type: ignore[union-attr]
    assert persisted["models"]["double"]["stable"] == 2
    assert registry.get_sample_value("switchyard_active_version", {"model": "double"}) == 2
    assert registry.get_sample_value("switchyard_version_switches_total", {"model": "double", "result": "ok"}) == 1
    assert registry.get_sample_value("switchyard_swap_step_seconds_count", {"model": "double", "step": "load"}) == 1
    events = (await client.get("/admin/models/double/events", headers=ADMIN)).json()["events"]
    assert [(e["action"], e["result"]) for e in events] == [("startup", "ok"), ("activate", "ok")]
    assert events[-1]["actor"].startswith("token:")


async def test_activate_is_a_no_op_when_the_version_is_already_stable(client: httpx.AsyncClient) -> None:
    report = (await admin(client, "/versions/1/activate")).json()
    assert (report["result"], report["steps"]) == ("unchanged", {})


async def test_activate_keeps_the_old_version_serving_when_loading_fails(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.broken.add(2)
    response = await admin(client, "/versions/2/activate")
    assert response.status_code == 422
    body = response.json()
    assert body["step"] == "load"
    assert "activate of model 'double' version 2 failed at step 'load'" in body["error"]
    assert "version 1 keeps serving" in body["error"]
    assert await served_version(client) == 1
    event = (await client.get("/admin/models/double/events", headers=ADMIN)).json()["events"][-1]
    assert (event["action"], event["result"], event["step"]) == ("activate", "failed", "load")


DECLARED_WARMUP = """
model_warmup {
  name: "zeros" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
}
"""


async def test_activate_serves_the_version_with_a_note_when_the_warm_up_it_invented_fails(
    client: httpx.AsyncClient, backend: ScriptedBackend, registry: CollectorRegistry
) -> None:
    backend.wrong_rows.add(2)  # no manifest, no model_warmup: the gateway made the data up, Triton would serve it
    response = await admin(client, "/versions/2/activate")
    assert response.status_code == 200, response.text
    report = response.json()
    # The comparison leaves out the invented rows the new version answered wrongly, and says so.
    assert report["comparison"]["skipped"][0].startswith("warm-up request (seeded random rows): output 'y'")
    assert await served_version(client) == 2
    note = (await client.post("/v2/repository/index", json={}, headers=ADMIN)).json()
    entry = next(e for e in note if e.get("version") == "2")
    assert entry["state"] == "READY"
    assert entry["reason"].startswith("serving without a full warm-up: warm-up request (zero-filled inputs")
    assert "output 'y' has shape [2, 4]" in entry["reason"]
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()
    assert [v["note"] is not None for v in status["loaded"]] == [False, True]
    labels = {"model": "double"}
    assert registry.get_sample_value("switchyard_invented_warmup_failures_total", labels) == 1


async def test_failed_load_leaves_nothing_loaded_and_is_the_model_s_problem_when_an_activation_fails(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.broken.add(2)  # the backend keeps a version whose load failed as UNAVAILABLE
    assert (await admin(client, "/versions/2/activate")).status_code == 422
    assert 2 not in backend.states  # what the swap tried to load, it unloaded
    (row,) = (await client.get("/admin/models", headers=ADMIN)).json()["models"]
    assert (row["ready"], row["loaded"]) == (True, [1])
    assert row["problem"] == (
        "version 2 does not serve: loading failed: loading model 'double' version 2 failed: not a model"
    )
    pinned = await infer(client, 2)
    assert pinned.status_code == 503
    assert "loading failed" in pinned.json()["error"]
    backend.broken.clear()  # fixed on disk: the next activation serves it, and the problem is gone
    assert (await admin(client, "/versions/2/activate")).status_code == 200
    (row,) = (await client.get("/admin/models", headers=ADMIN)).json()["models"]
    assert (row["loaded"], row["problem"]) == ([1, 2], None)


async def test_a_version_its_backend_dropped_after_a_failed_load_is_the_model_s_problem(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    """The Triton backend keeps no state for a version whose load it undid, only why it failed (its ``problem``)."""
    backend.problems[2] = "loading model 'double' version(s) [2] failed: INVALID_PROTOBUF"

    (row,) = (await client.get("/admin/models", headers=ADMIN)).json()["models"]
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()

    assert row["problem"] == "version 2 does not serve: loading model 'double' version(s) [2] failed: INVALID_PROTOBUF"
    assert status["failed"] == {"2": "loading model 'double' version(s) [2] failed: INVALID_PROTOBUF"}


async def test_activate_runs_a_declared_warm_up_sample_its_count_of_times(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    """Triton runs a ``model_warmup`` sample ``count`` times as it loads the version; on a backend that does not
    (this one, as the embedded one), the gateway does."""
    backend.extra_config = DECLARED_WARMUP.replace("batch_size: 1", "batch_size: 1 count: 3")
    before = len(backend.calls)
    response = await admin(client, "/versions/2/activate")
    assert response.status_code == 200, response.text
    once = len([call for call in backend.calls[before:] if call[0] == 2])
    backend.extra_config = DECLARED_WARMUP
    before = len(backend.calls)
    assert (await admin(client, "/versions/3/activate")).status_code == 200
    assert once - len([call for call in backend.calls[before:] if call[0] == 3]) == 2


async def test_activate_unloads_the_new_version_when_its_declared_warm_up_fails(
    client: httpx.AsyncClient, backend: ScriptedBackend, registry: CollectorRegistry
) -> None:
    backend.extra_config = DECLARED_WARMUP
    backend.wrong_rows.add(2)
    response = await admin(client, "/versions/2/activate")
    assert response.status_code == 422
    assert response.json()["step"] == "warmup"
    assert "output 'y' has shape [2, 4]" in response.json()["error"]
    assert 2 not in backend.states  # what the swap loaded, it unloaded
    assert await served_version(client) == 1
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()
    assert status["routing"]["stable"] == 1
    assert status["last_action"]["step"] == "warmup"
    assert registry.get_sample_value("switchyard_invented_warmup_failures_total", {"model": "double"}) is None


async def test_activate_answers_404_when_the_version_is_not_in_the_repository(client: httpx.AsyncClient) -> None:
    response = await admin(client, "/versions/9/activate")
    assert response.status_code == 404
    assert "'double' version 9 is not found; the repository has no version 9" in response.json()["error"]


async def test_second_action_gets_409_when_a_swap_of_the_model_is_running(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.load_hold = asyncio.Event()
    first = asyncio.create_task(admin(client, "/versions/2/activate"))
    assert await wait_until_async(lambda: backend.loads == [2])  # loading, held there
    second = await admin(client, "/rollback")
    assert second.status_code == 409
    assert "activate of version 2 is at step 'load'" in second.json()["error"]
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()
    assert status["action"]["step"] == "load"
    backend.load_hold.set()
    assert (await first).status_code == 200


async def test_rollback_returns_to_the_previous_version_instantly_when_it_is_still_loaded(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    assert (await admin(client, "/rollback")).status_code == 409  # nothing to roll back to yet
    await admin(client, "/versions/2/activate")
    loads = list(backend.loads)
    report = (await admin(client, "/rollback")).json()
    assert (report["action"], report["versions"]) == ("rollback", {"from": 2, "to": 1})
    assert backend.loads == loads  # still loaded: no load, no warm-up
    assert "warmup" not in report["steps"]
    assert report["routing"]["previous"] == 2
    assert await served_version(client) == 1


async def test_activate_unloads_the_replaced_version_when_keep_previous_is_false(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    report = (await admin(client, "/versions/2/activate", {"keep_previous": False})).json()
    assert report["unloaded"] == [1]
    assert 1 not in backend.states
    assert (await infer(client, 1)).status_code == 404


async def test_drain_waits_for_requests_on_the_old_version_when_they_are_in_flight(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    held = backend.hold = asyncio.Event()
    slow = asyncio.create_task(infer(client))
    assert await wait_until_async(lambda: len(backend.calls) == 1)  # in flight on version 1, held there
    backend.hold = None  # that request only: the swap's warm-up is answered
    swap = asyncio.create_task(admin(client, "/versions/2/activate", {"keep_previous": False, "compare": False}))

    async def step() -> object:
        action = (await client.get("/admin/models/double", headers=ADMIN)).json()["action"]
        return action and action["step"]

    assert await eventually_async(step, "drain") == "drain"
    assert not slow.done()
    held.set()
    report = (await swap).json()
    assert report["drained"] is True
    assert slow.done()  # the swap waited for it before unloading version 1
    assert (await slow).json()["model_version"] == "1"  # admitted before the flip, answered by the old version


async def test_drain_gives_up_and_reports_what_is_left_when_the_timeout_passes(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    held = backend.hold = asyncio.Event()
    slow = asyncio.create_task(infer(client))
    assert await wait_until_async(lambda: len(backend.calls) == 1)  # in flight on version 1, held there
    backend.hold = None  # that request only: the swap's warm-up is answered
    body = {"drain_timeout_s": 0.05, "compare": False}
    report = (await admin(client, "/versions/2/activate", body)).json()
    assert (report["drained"], report["in_flight_left"]) == (False, 1)
    held.set()
    await slow


async def test_unload_refuses_the_stable_version_and_unloads_others_when_asked(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    refused = await admin(client, "/versions/1/unload")
    assert refused.status_code == 409
    assert "is the stable version" in refused.json()["error"]
    assert (await admin(client, "/versions/2/load")).json()["result"] == "ok"
    assert (await infer(client, 2)).status_code == 200
    assert (await admin(client, "/versions/2/unload")).json()["result"] == "ok"
    assert (await admin(client, "/versions/2/unload")).status_code == 404
    assert await served_version(client) == 1


async def test_options_are_refused_with_400_when_unknown_or_mistyped(client: httpx.AsyncClient) -> None:
    for body, message in [
        ({"keep_prev": True}, "unknown option 'keep_prev'"),
        ({"compare": "yes"}, "option 'compare' must be true or false"),
        ({"drain_timeout_s": -1}, "must be a number of seconds from 0 to 600"),
        ([1], "must be a JSON object"),
    ]:
        response = await admin(client, "/versions/2/activate", body)
        assert (response.status_code, message in response.json()["error"]) == (400, True), response.text
    response = await client.post("/admin/models/double/versions/two/activate", headers=ADMIN)
    assert response.status_code == 400
    assert (await client.post("/admin/models/nope/rollback", headers=ADMIN)).status_code == 404


async def test_restarted_gateway_serves_the_persisted_routing_when_it_starts_again(
    backend: ScriptedBackend, settings: Settings
) -> None:
    async with serving(settings, backend) as http:
        await admin(http, "/versions/2/activate")
    restarted = ScriptedBackend(states={1: VersionState.READY, 2: VersionState.READY})
    async with serving(settings, restarted) as http:
        status = (await http.get("/admin/models/double", headers=ADMIN)).json()
        assert (status["routing"]["stable"], status["routing"]["previous"]) == (2, 1)
        assert await served_version(http) == 2


async def test_restart_loads_what_the_policy_selects_beside_the_recorded_versions_and_reports_one_that_fails(
    backend: ScriptedBackend, settings: Settings
) -> None:
    async with serving(settings, backend):
        pass  # a first start: the record says version 1 is loaded, as the policy (specific [1]) selects
    config = Path(settings.repository) / "double" / "config.pbtxt"
    config.write_text(config.read_text().replace("versions: [ 1 ]", "versions: [ 1, 2 ]"))
    restarted = ScriptedBackend(
        states={1: VersionState.READY, 2: VersionState.UNAVAILABLE}, problems={2: "loading failed: not a model"}
    )
    async with serving(settings, restarted) as http:
        assert restarted.initial == {"double": {1, 2}}  # the policy's new choice too, not only the record's
        (row,) = (await http.get("/admin/models", headers=ADMIN)).json()["models"]
        assert (row["ready"], row["stable"], row["loaded"]) == (True, 1, [1])
        assert row["problem"] == "version 2 does not serve: loading failed: not a model"
        status = (await http.get("/admin/models/double", headers=ADMIN)).json()
        assert status["problem"] == row["problem"]


async def test_scan_lists_a_version_exported_while_running_and_does_not_serve_it(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    version_dir = Path(settings.repository) / "double" / "3"
    version_dir.mkdir()
    (version_dir / "model.onnx").write_bytes(b"")
    scan = (await client.post("/admin/repository/scan", headers=ADMIN)).json()
    assert scan["new_versions"] == {"double": [3]}
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()
    assert status["available"] == [1, 2, 3]
    assert 3 not in [v["version"] for v in status["loaded"]]
    assert await served_version(client) == 1
    assert (await infer(client, 3)).status_code == 404
