"""The ops console's server side: the static page with its security headers, its assets (and nothing else), the
live-figures endpoint behind the admin token, the series it computes from the gateway's own counters, and the bulk
read the page polls (every model's status, figures and last swap)."""

from __future__ import annotations

import asyncio
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend
from swap_races_support import ADMIN as REPLICA_ADMIN
from swap_races_support import MODEL, gateway, scale_repository, settings_for

from services.gateway.admin.console import ASSETS, UI
from services.gateway.admin.live import LiveFigures, quantile
from services.gateway.app import create_app
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from tests.redis_server import redis_server
from tests.waiting import eventually_async, wait_until_async

TOKEN = "s3cret-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
X = {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6, 7, 8]}
ROOT = Path(__file__).resolve().parents[2]


async def test_console_page_is_served_with_strict_security_headers_when_requested(client: httpx.AsyncClient) -> None:
    for path in ("/admin/ui", "/admin/ui/"):
        response = await client.get(path)
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert "unsafe-eval" not in csp
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-store"
        assert "set-cookie" not in response.headers
        assert '<script type="module" src="/admin/ui/console.js">' in response.text


async def test_console_assets_are_revalidated_by_etag_when_fetched_again(client: httpx.AsyncClient) -> None:
    for name in ("console.js", "console.css", "icon.svg"):
        response = await client.get(f"/admin/ui/{name}")
        assert response.status_code == 200
        assert response.content == (UI / name).read_bytes()
        assert response.headers["content-type"].startswith(ASSETS[name].split(";")[0])
        assert response.headers["cache-control"] == "no-cache"
        again = await client.get(f"/admin/ui/{name}", headers={"If-None-Match": response.headers["etag"]})
        assert (again.status_code, again.content) == (304, b"")


async def test_console_answers_404_when_a_file_outside_the_page_is_asked(client: httpx.AsyncClient) -> None:
    for path in ("/admin/ui/console.py", "/admin/ui/..%2fauth.py", "/admin/ui/index.htm", "/admin/ui/ui/console.js"):
        response = await client.get(path)
        assert response.status_code == 404, path
        assert b"import" not in response.content


def test_console_page_refers_only_to_its_own_origin_when_read() -> None:
    """No CDN, font or analytics: every URL in the page is one of its own files or a same-origin admin path."""
    html = (UI / "index.html").read_text()
    for url in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert url.startswith(("/admin/ui/", "#")), url
    assert "<script>" not in html
    assert " style=" not in html
    assert " on" + "click=" not in html
    script = (UI / "console.js").read_text()
    assert re.findall(r"https?://[^\s\"'`]+", script) == ["http://www.w3.org/2000/svg"]  # a namespace, never fetched
    assert "innerHTML" not in script
    assert "document.cookie" not in script
    assert "localStorage" not in script
    assert re.findall(r"fetch\((\w+)", script) == ["path"]  # one fetch, in api(), on a path of this gateway
    css = (UI / "console.css").read_text()
    assert "url(" not in css
    assert "@import" not in css


def test_console_files_ship_as_package_data_when_the_wheel_is_built() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["services.gateway.admin"]
    for name in ASSETS:
        assert (UI / name).is_file(), name
        assert any(fnmatch(f"ui/{name}", pattern) for pattern in patterns), f"ui/{name} is not package data"


async def test_live_figures_answer_401_403_404_and_400_when_asked_wrongly(client: httpx.AsyncClient) -> None:
    assert (await client.get("/admin/models/double/live")).status_code == 401
    wrong = await client.get("/admin/models/double/live", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()) == (403, {"error": "the admin token is not valid"})
    assert (await client.get("/admin/models/nothere/live", headers=ADMIN)).status_code == 404
    for query in ("minutes=0", "minutes=11", "step=61", "step=x", "minutes=-1"):
        response = await client.get(f"/admin/models/double/live?{query}", headers=ADMIN)
        assert response.status_code == 400, query
        assert "must be an integer" in response.json()["error"]


async def test_live_figures_count_the_requests_answered_when_the_gateway_served_them(
    backend: ScriptedBackend, settings: Settings
) -> None:
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://gateway"
    ) as client:
        await served_and_counted(client, app.state.live)


async def served_and_counted(client: httpx.AsyncClient, live: LiveFigures) -> None:
    live.sample()
    for _ in range(5):
        assert (await client.post("/v2/models/double/infer", json={"inputs": [X]})).status_code == 200
    await asyncio.sleep(live.period_s * 1.2)  # real time: the series step is a second at least
    live.sample()
    response = await client.get("/admin/models/double/live?minutes=1&step=1", headers=ADMIN)
    assert response.status_code == 200
    body = response.json()
    assert (body["model"], body["stable"], body["canary"], body["shadow_policy"]) == ("double", 1, None, None)
    (series,) = body["versions"]
    assert series["version"] == 1
    assert sum(point["requests"] for point in series["points"]) == 5
    (answered,) = [point for point in series["points"] if point["requests"]]
    assert answered["errors"] == 0
    assert answered["error_rate"] == 0
    assert answered["rps"] > 0
    assert answered["p50_ms"] is not None
    assert answered["p99_ms"] >= answered["p50_ms"]


async def test_console_bulk_read_answers_401_403_and_400_when_asked_wrongly(client: httpx.AsyncClient) -> None:
    """The same token checks as the per-model reads (a read-only token is let in: ``test_admin_roles``)."""
    assert (await client.get("/admin/console/models")).status_code == 401
    wrong = await client.get("/admin/console/models", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()) == (403, {"error": "the admin token is not valid"})
    for query in ("minutes=0", "minutes=11", "step=61", "step=x"):
        response = await client.get(f"/admin/console/models?{query}", headers=ADMIN)
        assert response.status_code == 400, query
        assert "must be an integer" in response.json()["error"]
    assert (await client.get("/admin/events?limit=0", headers=ADMIN)).status_code == 400


async def test_console_bulk_read_shows_a_swap_when_its_event_came_after_a_read_between_flip_and_drain(
    backend: ScriptedBackend, settings: Settings
) -> None:
    """A swap writes its audit event after the drain, well after the flip that changes the routing: a poll between
    the two sees the new routing without the event, and the next one after the drain must show the swap (kept by
    the routing generation alone, the card would show the older swap until the next routing change)."""
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    router = app.state.manager.router
    async with LifespanManager(app) as manager, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=manager.app), base_url="http://gateway"
    ) as client:

        async def last_swap() -> object:
            (model,) = (await client.get("/admin/console/models", headers=ADMIN)).json()["models"]
            return model["last_swap"]

        assert await last_swap() is None
        held = backend.hold = asyncio.Event()
        backend.calls.clear()
        served = asyncio.create_task(client.post("/v2/models/double/infer", json={"inputs": [X]}))  # on version 1
        assert await wait_until_async(lambda: len(backend.calls) == 1)
        backend.hold = None  # the warm-up's requests pass; the one on version 1 waits, and the drain with it
        activation = asyncio.create_task(client.post("/admin/models/double/versions/2/activate", headers=ADMIN))
        try:
            assert await wait_until_async(lambda: router.record("double").stable == 2)
            assert await last_swap() is None  # flipped, draining: no event yet
        finally:
            held.set()
        assert (await served).status_code == 200
        assert (await activation).status_code == 200, (await activation).text
        swap = await last_swap()
        assert isinstance(swap, dict)
        assert (swap["action"], swap["versions"], swap["result"]) == ("activate", {"from": 1, "to": 2}, "ok")


@pytest.mark.slow  # a Redis server and two gateways
async def test_console_bulk_read_shows_a_swap_another_replica_logged_after_this_one_followed_its_flip(
    tmp_path: Path,
) -> None:
    """Replicas sharing Redis: B follows A's flip within a second, while A still drains; A logs the swap only then.
    B's console, having read the audit log at the new routing generation before the event was there, must read it
    again (nothing else changes on B when A logs it)."""
    repository = scale_repository(tmp_path / "repository", (1, 2))
    with redis_server(tmp_path / "redis") as redis:
        async with gateway(settings_for(repository, tmp_path / "a", redis_url=redis.url)) as a, gateway(
            settings_for(repository, tmp_path / "b", redis_url=redis.url)
        ) as b:

            async def last_swap() -> object:
                answer = await b.http.get("/admin/console/models", headers=REPLICA_ADMIN)
                assert answer.status_code == 200, answer.text
                (model,) = answer.json()["models"]
                return model["last_swap"]

            assert await last_swap() is None
            leases = a.app.state.manager.leases
            leases.acquire(MODEL, 2)  # a request in flight on the stable version: A's drain waits for it
            activation = asyncio.create_task(a.admin("POST", "/versions/1/activate"))
            try:
                assert await eventually_async(b.stable, 1) == 1  # B followed the flip
                assert await last_swap() is None  # A has not logged it yet
            finally:
                leases.release(MODEL, 2)
            assert (await activation).status_code == 200

            async def versions() -> object:
                swap = await last_swap()
                return swap["versions"] if isinstance(swap, dict) else None

            swapped: object = {"from": 2, "to": 1}
            assert await eventually_async(versions, swapped) == swapped


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_live_series_give_rate_errors_and_quantiles_per_step_when_counters_grow() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = GatewayMetrics(registry)
    live = LiveFigures(metrics, clock=clock, wall=clock)
    live.sample()
    for _second in range(10):
        clock.now += 1
        for _ in range(10):  # 10 requests a second: 9 fast ones on version 1, then one slow 503 on version 2
            metrics.requests.labels("m", "1", "rest", "200").inc()
            metrics.request_duration.labels("m", "1").observe(0.003)
        metrics.requests.labels("m", "2", "rest", "503").inc()
        metrics.request_duration.labels("m", "2").observe(0.2)
        metrics.requests.labels("m", "_other", "rest", "404").inc()  # an unknown version: no series of its own
        metrics.requests.labels("other", "1", "rest", "200").inc()
        live.sample()
    figures = live.series("m", minutes=1, step_s=2)
    stable, canary = figures["versions"]
    assert [stable["version"], canary["version"]] == [1, 2]
    assert len(stable["points"]) == 5  # 10 seconds in steps of 2
    for point in stable["points"]:
        assert (point["requests"], point["rps"], point["errors"]) == (20, 10.0, 0)
        assert 2.5 < point["p50_ms"] <= 5.0
        assert 2.5 < point["p99_ms"] <= 5.0
    for point in canary["points"]:
        assert (point["requests"], point["errors"], point["error_rate"]) == (2, 2, 1.0)
        assert 100 < point["p99_ms"] <= 250
    assert [point["t"] for point in stable["points"]] == [1002.0, 1004.0, 1006.0, 1008.0, 1010.0]
    assert live.series("absent", minutes=1, step_s=2)["versions"] == []


def test_live_series_read_shadow_divergence_when_shadow_runs_are_counted() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = GatewayMetrics(registry)
    live = LiveFigures(metrics, clock=clock, wall=clock)
    live.sample()
    clock.now += 1
    for divergence in (1e-8, 1e-8, 5e-3):
        metrics.shadow_requests.labels("m", "ok").inc()
        metrics.shadow_divergence.labels("m").observe(divergence)
    metrics.shadow_requests.labels("m", "dropped").inc()
    metrics.shadow_argmax_disagreements.labels("m").inc(2)
    live.sample()
    (point,) = live.series("m", minutes=1, step_s=1)["shadow"]
    assert (point["compared"], point["not_compared"], point["argmax_disagreements"]) == (3, 1, 2)
    assert (point["divergence_p50_le"], point["divergence_max_le"]) == (1e-7, 1e-2)


def test_live_series_forget_what_is_older_than_kept_when_time_passes() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = GatewayMetrics(registry)
    live = LiveFigures(metrics, clock=clock, wall=clock, keep_s=5)
    for _ in range(20):
        metrics.requests.labels("m", "1", "rest", "200").inc()
        live.sample()
        clock.now += 1
    points = live.series("m", minutes=10, step_s=1)["versions"][0]["points"]
    assert 4 <= len(points) <= 6


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.5, 0.0015625), (0.9, 0.0023125), (1.0, 0.0025)],
)
def test_quantile_interpolates_within_the_bucket_when_the_rank_falls_inside(q: float, expected: float) -> None:
    # 10 observations: 2 up to 1 ms, 8 between 1 and 2.5 ms; none above.
    edges = (0.001, 0.0025, 0.005, float("inf"))
    assert quantile((2, 10, 10, 10), edges, q) == pytest.approx(expected)


def test_quantile_is_none_when_nothing_was_observed() -> None:
    assert quantile((0, 0, 0), (0.1, 1.0, float("inf")), 0.99) is None
    assert quantile((0, 0, 3), (0.1, 1.0, float("inf")), 0.99) == 1.0  # all above the last edge: that edge


async def test_compare_preview_reports_the_difference_without_changing_anything_when_both_versions_are_loaded(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    backend.factor = {2: 1.5}
    not_loaded = await client.post("/admin/models/double/versions/2/compare", headers=ADMIN)
    assert not_loaded.status_code == 409
    assert "version 2 of model 'double' is not loaded" in not_loaded.json()["error"]
    assert (await client.post("/admin/models/double/versions/2/load", headers=ADMIN)).status_code == 200
    before = (await client.get("/admin/models/double", headers=ADMIN)).json()
    events = (await client.get("/admin/models/double/events", headers=ADMIN)).json()["events"]

    response = await client.post("/admin/models/double/versions/2/compare", headers=ADMIN)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["model"], body["version"], body["comparison"]["against"]) == ("double", 2, 1)
    assert body["comparison"]["max_abs_diff"]["y"] > 0  # 2x against 3x
    assert body["comparison"]["max_abs_diff"]["z"] == 0
    after = (await client.get("/admin/models/double", headers=ADMIN)).json()
    assert after["routing"] == before["routing"]
    assert after["action"] is None
    logged = (await client.get("/admin/models/double/events", headers=ADMIN)).json()["events"]
    assert logged == events  # the compare left no trace in the audit log


async def test_compare_preview_is_refused_when_asked_wrongly(client: httpx.AsyncClient) -> None:
    path = "/admin/models/double/versions/1/compare"
    assert (await client.post(path)).status_code == 401
    assert (await client.post(path, headers={"Authorization": "Bearer nope"})).status_code == 403
    stable = await client.post(path, headers=ADMIN)
    assert (stable.status_code, stable.json()) == (400, {"error": "version 1 is the stable version of model 'double'"})
    assert (await client.post("/admin/models/nothere/versions/2/compare", headers=ADMIN)).status_code == 404
    absent = await client.post("/admin/models/double/versions/99/compare", headers=ADMIN)
    assert absent.status_code == 404  # not 409 "not loaded: an activation loads it": there is nothing to activate
    assert "'double' version 99 is not found; the repository has no version 99 of it" in absent.json()["error"]
    assert (await client.post("/admin/models/double/versions/x/compare", headers=ADMIN)).status_code == 400
    assert (await client.get(path, headers=ADMIN)).status_code == 405


@pytest.mark.slow  # counts reads over real time
async def test_live_figures_are_read_less_often_when_no_console_is_watching() -> None:
    live = LiveFigures(GatewayMetrics(CollectorRegistry()), period_s=0.01, idle_period_s=0.1, watched_s=10.0)
    live.start()
    try:
        await asyncio.sleep(0.5)  # the span whose reads are counted
        unwatched = live.reads
        live.series("m", minutes=1, step_s=1)  # asking makes the console a watcher from now on
        await asyncio.sleep(0.5)  # the span whose reads are counted
        watched = live.reads - unwatched
    finally:
        await live.close()
    assert 2 <= unwatched <= 6  # about one read per 100 ms
    # About one read per 10 ms (50); a busy machine's late timers leave fewer, never as few as unwatched.
    assert watched >= 2 * unwatched
