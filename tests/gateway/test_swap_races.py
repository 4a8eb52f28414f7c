"""Version actions racing each other and the repository API, on the embedded backend with a real ONNX model: what
an operator does at 3 a.m. must leave the routing, what serves and what the admin API says in agreement."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from swap_races_support import ADMIN, MODEL, Traffic, X, gateway, scale_repository, settings_for, write_version

from services.gateway.versions import replicas
from tests.redis_server import redis_server
from tests.waiting import eventually_async


async def test_activating_the_stable_version_routes_it_again_when_the_repository_api_unloaded_the_model(
    tmp_path: Path,
) -> None:
    settings = settings_for(scale_repository(tmp_path / "repository"), tmp_path / "state")
    async with gateway(settings) as g:
        assert await g.served() == 2
        unloaded = await g.http.post(f"/v2/repository/models/{MODEL}/unload", headers=ADMIN)
        assert unloaded.status_code == 200, unloaded.text
        assert (await g.infer()).status_code == 404

        activated = await g.admin("POST", "/versions/2/activate")

        assert activated.status_code == 200, activated.text
        report = activated.json()
        assert (report["result"], report["versions"]) == ("ok", {"from": None, "to": 2})
        assert report["routing"]["unloaded"] is False
        assert report["routing"]["previous"] is None  # not "2 after 2": nothing else served before
        assert await g.served() == 2
        status = await g.status()
        assert status["problem"] is None
        assert [v["version"] for v in status["loaded"]] == [2]


@pytest.mark.slow
@pytest.mark.parametrize("cache", [None, 512.0], ids=["all-loaded", "model-cache"])
async def test_a_replica_that_could_not_follow_a_switch_follows_it_once_it_can_and_says_so_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: float | None
) -> None:
    """With the model cache a replica loads a version on its first request, not as it follows: it must still not
    route to one its repository does not have (every request would fail)."""
    monkeypatch.setattr(replicas, "RETRY_AFTER_FAILURE_S", 0.5)
    first = scale_repository(tmp_path / "a" / "repository", (1, 2, 3))
    second = scale_repository(tmp_path / "b" / "repository", (1, 2))  # its copy of the repository lags behind
    with redis_server(tmp_path / "redis") as redis:
        more = {"redis_url": redis.url, "model_cache_mb": cache}
        async with gateway(settings_for(second, tmp_path / "b", **more)) as b, gateway(
            settings_for(first, tmp_path / "a", **more)
        ) as a:
            assert (await a.admin("POST", "/versions/2/activate")).status_code == 200
            assert await eventually_async(b.stable, 2) == 2
            traffic = Traffic([a, b]).start()
            switched = await a.admin("POST", "/versions/3/activate")
            assert switched.status_code == 200, switched.text

            async def b_is_behind() -> bool:
                return "routing generation" in str((await b.status())["problem"])

            assert await eventually_async(b_is_behind, True)
            problem = (await b.status())["problem"]
            assert f"generation {switched.json()['routing']['generation']} (stable 3)" in problem, problem
            assert "no version 3" in problem, problem
            assert "serves version 2 meanwhile" in problem, problem
            assert await b.served() == 2
            # An action on B would build on a routing B cannot serve: refused, saying why and where to act.
            refused = await b.admin("POST", "/versions/1/activate")
            assert refused.status_code == 503, refused.text
            assert "no version 3" in refused.json()["error"], refused.text
            assert "act through a gateway that serves it" in refused.json()["error"], refused.text

            write_version(second / MODEL, 3)  # the copy catches up: B takes the routing by itself

            assert await eventually_async(b.stable, 3, timeout_s=20) == 3
            assert await b.served() == 3
            assert (await b.status())["problem"] is None
            assert await traffic.stop() == []




@pytest.mark.slow
async def test_a_redis_restarted_during_a_swap_holds_no_lock_of_the_swap_once_it_is_back(tmp_path: Path) -> None:
    repository = scale_repository(tmp_path / "repository", (1, 2, 3))
    with redis_server(tmp_path / "redis") as redis:
        # A lock's time to live far beyond the wait below: only its release can free the model in time.
        more = {"redis_url": redis.url, "redis_lock_ttl_s": 120.0}
        async with gateway(settings_for(repository, tmp_path / "a", **more)) as a, gateway(
            settings_for(repository, tmp_path / "b", **more)
        ) as b:
            assert await a.served() == await b.served() == 3
            leases = a.app.state.manager.leases
            leases.acquire(MODEL, 3)  # a request on version 3 in flight: the swap waits in its drain step
            swap = asyncio.create_task(a.admin("POST", "/versions/2/activate", {"drain_timeout_s": 60}))

            async def draining() -> str:
                action = (await a.status())["action"]
                return "" if action is None else str(action["step"])

            assert await eventually_async(draining, "drain") == "drain"
            redis.kill()  # the swap ends while Redis is down: its lock cannot be released then
            leases.release(MODEL, 3)
            assert (await swap).status_code == 200
            redis.start()  # back from its append-only file, with the lock the swap took

            async def rollback_on_b() -> int:
                return int((await b.admin("POST", "/rollback")).status_code)

            assert await eventually_async(rollback_on_b, 200, timeout_s=10) == 200
            assert await eventually_async(a.stable, 3) == 3
            assert await a.served() == await b.served() == 3


@pytest.mark.slow
async def test_a_replica_starting_without_the_shared_stable_version_leaves_the_shared_routing_as_the_others_serve_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replicas, "RETRY_AFTER_FAILURE_S", 0.5)
    first = scale_repository(tmp_path / "a" / "repository", (1, 2, 3))
    second = scale_repository(tmp_path / "b" / "repository", (1, 2))  # its copy of the repository lags behind
    with redis_server(tmp_path / "redis") as redis:
        async with gateway(settings_for(first, tmp_path / "a", redis_url=redis.url)) as a:
            split = await a.admin("PUT", "/traffic", {"canary": 1, "weight": 10})
            assert split.status_code == 200, split.text
            shared = (await a.status())["routing"]
            traffic = Traffic([a]).start()

            async with gateway(settings_for(second, tmp_path / "b", redis_url=redis.url)) as b:
                assert await b.served() == 2  # what it can serve, its latest version
                problem = str((await b.status())["problem"])
                assert f"routing generation {shared['generation']} (stable 3)" in problem, problem
                assert "serves version 2 meanwhile" in problem, problem
                # A serves as before, and the record in Redis is the one A wrote: nothing switched it back.
                assert (await a.status())["routing"] == shared
                assert await a.stable() == 3

                write_version(second / MODEL, 3)  # the copy catches up: B takes the shared routing by itself

                assert await eventually_async(b.stable, 3, timeout_s=20) == 3
                assert (await b.status())["routing"]["canary"] == shared["canary"]
                assert (await b.status())["problem"] is None
            assert await traffic.stop() == []


async def test_activating_a_loaded_version_whose_folder_holds_another_export_now_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    repository = scale_repository(tmp_path / "repository", ())
    for version in (1, 2):
        write_version(repository / MODEL, version, exported_at="2026-12-01T10:00:00+00:00")
    async with gateway(settings_for(repository, tmp_path / "state")) as g:
        assert (await g.admin("POST", "/versions/1/load")).status_code == 200
        # The model deleted and exported again while version 1 is loaded: its folder now holds y = 10 x.
        shutil.rmtree(repository / MODEL / "1")
        write_version(repository / MODEL, 1, factor=10.0, exported_at="2026-12-02T10:00:00+00:00")

        refused = await g.admin("POST", "/versions/1/activate")

        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert "exported 2026-12-01T10:00:00+00:00" in error, error
        assert "exported 2026-12-02T10:00:00+00:00" in error, error
        assert f"switchyard models unload {MODEL} 1" in error, error
        assert await g.served() == 2  # nothing changed
        assert (await g.admin("POST", "/versions/1/unload")).status_code == 200
        activated = await g.admin("POST", "/versions/1/activate")
        assert activated.status_code == 200, activated.text
        answer = await g.infer()
        assert answer.json()["outputs"][0]["data"] == [10 * v for v in X]  # the files on disk, as the record names
        assert "2026-12-02T10:00:00" in activated.json()["routing"]["exports"]["1"]
