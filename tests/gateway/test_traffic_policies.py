"""Canary splits and shadow traffic over a scripted backend, through the admin API: the split's share and
stickiness, the automatic pull-back of a failing canary, promotion, shadow answers never served, persistence."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter

import httpx
import pytest
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend

from services.gateway.settings import Settings
from services.gateway.tensors.types import VersionState
from tests.waiting import eventually_async, wait_until_async

ADMIN = {"Authorization": "Bearer s3cret-admin-token"}


def body(value: float = 1.0) -> dict[str, object]:
    return {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [value, 2, 3, 4]}]}


async def traffic(client: httpx.AsyncClient, policy: dict[str, object]) -> httpx.Response:
    return await client.put("/admin/models/double/traffic", headers=ADMIN, json=policy)


async def test_canary_takes_its_share_of_unversioned_requests_when_weight_is_20(client: httpx.AsyncClient) -> None:
    response = await traffic(client, {"canary": 2, "weight": 20})
    assert response.status_code == 200, response.text
    assert response.json()["routing"]["canary"]["weight"] == 20.0
    seen = Counter()
    for _ in range(20):
        answers = await asyncio.gather(*(client.post("/v2/models/double/infer", json=body()) for _i in range(100)))
        seen.update(a.headers["x-model-version"] for a in answers)
    share = seen["2"] / 2000
    assert 0.16 <= share <= 0.24, seen
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()
    window = status["traffic"]["canary"]["window"]
    assert window["canary"]["requests"] == seen["2"]
    assert window["stable"]["requests"] == seen["1"]


async def test_sticky_canary_keeps_each_session_on_one_side_when_the_header_is_sent(
    client: httpx.AsyncClient,
) -> None:
    await traffic(client, {"canary": 2, "weight": 30, "sticky_header": "X-Session-Id"})
    sides: dict[str, set[str]] = {}
    for session in range(200):
        for _ in range(4):
            answer = await client.post("/v2/models/double/infer", json=body(), headers={"X-Session-Id": f"s{session}"})
            sides.setdefault(f"s{session}", set()).add(answer.headers["x-model-version"])
    assert all(len(versions) == 1 for versions in sides.values())
    on_canary = sum(versions == {"2"} for versions in sides.values())
    assert 30 <= on_canary <= 90  # about 30 % of 200 sessions


async def test_failing_canary_is_pulled_back_and_named_when_it_breaks_its_error_bound(
    client: httpx.AsyncClient, backend: ScriptedBackend, registry: CollectorRegistry
) -> None:
    backend.failing_when_positive.add(2)
    policy = {"canary": 2, "weight": 50, "rollback": {"max_error_rate": 0.05, "window_s": 10, "min_requests": 20}}
    assert (await traffic(client, policy)).status_code == 200
    generator = random.Random(0)
    stable_failures = 0
    for _ in range(60):
        answers = await asyncio.gather(
            *(client.post("/v2/models/double/infer", json=body(generator.uniform(-1, 1))) for _ in range(10))
        )
        stable_failures += sum(a.status_code != 200 and a.headers["x-model-version"] != "2" for a in answers)
        status = (await client.get("/admin/models/double", headers=ADMIN)).json()
        if status["routing"]["canary"]["weight"] == 0:
            break
        await asyncio.sleep(0.05)  # paces the traffic: bursts of 10, polled until the canary is pulled back
    canary = status["routing"]["canary"]
    assert canary["weight"] == 0, "the failing canary was not pulled back"
    assert "5xx rate" in canary["rolled_back"]
    assert stable_failures == 0
    labels = {"model": "double", "reason": "error_rate"}
    assert registry.get_sample_value("switchyard_canary_rollbacks_total", labels) == 1
    events = (await client.get("/admin/models/double/events", headers=ADMIN)).json()["events"]
    assert events[-1]["action"] == "canary_rollback"
    assert events[-1]["detail"]["reason"] == "error_rate"
    after = [await client.post("/v2/models/double/infer", json=body(0.5)) for _ in range(20)]
    assert {a.headers["x-model-version"] for a in after} == {"1"}


async def test_canary_is_promoted_when_it_behaves_for_promote_after_s(client: httpx.AsyncClient) -> None:
    policy = {"canary": 2, "weight": 50, "promote_after_s": 1, "rollback": {"max_error_rate": 0.5}}
    await traffic(client, policy)
    for _ in range(40):
        await client.post("/v2/models/double/infer", json=body())
        await asyncio.sleep(0.05)  # real time must pass (promote_after_s): 40 rounds are 2 s at least
        routing = (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"]
        if routing["stable"] == 2:
            break
    assert (routing["stable"], routing["previous"], routing["canary"]) == (2, 1, None)


async def test_unload_of_the_canary_s_version_is_refused_naming_the_split_until_it_is_cleared(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    policy = {"canary": 2, "weight": 20, "promote_after_s": 3600, "rollback": {"max_error_rate": 0.1}}
    assert (await traffic(client, policy)).status_code == 200
    refused = await client.post("/admin/models/double/versions/2/unload", headers=ADMIN)
    assert refused.status_code == 409
    assert refused.json()["error"] == (
        "version 2 is the canary of model 'double' (20% of its traffic); end the split first (switchyard models "
        'traffic double --clear, or PUT /admin/models/double/traffic {"canary": null}), then unload it'
    )
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()
    assert 2 in [v["version"] for v in status["loaded"] if v["state"] == "READY"]
    assert status["routing"]["canary"]["version"] == 2
    assert (await traffic(client, {"canary": None})).status_code == 200
    assert (await client.post("/admin/models/double/versions/2/unload", headers=ADMIN)).status_code == 200
    persisted = json.loads(settings.state_path.read_text())["models"]["double"]  # type: ignore[union-attr]
    assert (persisted["canary"], persisted["loaded"]) == (None, [1])


async def test_unload_of_the_shadow_s_version_is_refused_naming_the_shadow_until_it_is_stopped(
    client: httpx.AsyncClient,
) -> None:
    await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": 2, "percent": 10})
    refused = await client.post("/admin/models/double/versions/2/unload", headers=ADMIN)
    assert refused.status_code == 409
    assert "version 2 is the shadow of model 'double' (10% of its requests copied to it)" in refused.json()["error"]
    assert "switchyard models shadow double --clear" in refused.json()["error"]
    await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": None})
    assert (await client.post("/admin/models/double/versions/2/unload", headers=ADMIN)).status_code == 200


async def test_canary_is_not_promoted_while_its_version_is_not_ready_and_is_once_it_is(
    client: httpx.AsyncClient, backend: ScriptedBackend, caplog: pytest.LogCaptureFixture
) -> None:
    await traffic(client, {"canary": 2, "weight": 50, "promote_after_s": 1})
    backend.states[2] = VersionState.UNAVAILABLE  # its server lost it: no request reaches it, none proves it
    held = "canary version 2 is due for promotion but is not loaded and ready"
    assert await wait_until_async(lambda: any(held in r.getMessage() for r in caplog.records))
    routing = (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"]
    assert (routing["stable"], routing["canary"]["version"]) == (1, 2)
    backend.states[2] = VersionState.READY

    async def stable() -> object:
        return (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"]["stable"]

    assert await eventually_async(stable, 2) == 2


async def test_shadow_answers_are_compared_and_never_served_when_sampled(
    client: httpx.AsyncClient, backend: ScriptedBackend, registry: CollectorRegistry
) -> None:
    backend.factor[2] = 1.5
    response = await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": 2, "percent": 100})
    assert response.status_code == 200, response.text
    answers = [await client.post("/v2/models/double/infer", json=body()) for _ in range(30)]
    assert {a.headers["x-model-version"] for a in answers} == {"1"}
    # Shadow calls run after their answers went out: wait for the last comparison.
    labels = {"model": "double", "result": "ok"}
    assert await wait_until_async(lambda: registry.get_sample_value("switchyard_shadow_requests_total", labels) == 30)
    # y = 2x on version 1 and 3x on version 2 for x = [1, 2, 3, 4]: the largest difference is 4.
    assert registry.get_sample_value("switchyard_shadow_divergence_sum", {"model": "double"}) == 30 * 4.0
    assert sum(1 for call in backend.calls if call[0] == 2) >= 30
    cleared = await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": None})
    assert cleared.json()["routing"]["shadow"] is None


async def test_shadow_calls_never_hold_up_the_answers_they_copy(
    client: httpx.AsyncClient, backend: ScriptedBackend, registry: CollectorRegistry
) -> None:
    backend.version_delay_s[2] = 2.0  # a shadow version far slower than the stable one
    await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": 2, "percent": 100})
    started = time.monotonic()
    answers = [await client.post("/v2/models/double/infer", json=body()) for _ in range(10)]
    elapsed = time.monotonic() - started
    assert [a.status_code for a in answers] == [200] * 10
    assert elapsed < 2.0, f"10 answers took {elapsed:.2f} s: they waited for their 2 s shadow calls"
    ok, dropped = ({"model": "double", "result": r} for r in ("ok", "dropped"))

    def shadowed() -> float:
        return (registry.get_sample_value("switchyard_shadow_requests_total", ok) or 0.0) + (
            registry.get_sample_value("switchyard_shadow_requests_total", dropped) or 0.0)

    assert await wait_until_async(lambda: shadowed() == 10)  # each copied: compared once done, or dropped
    assert (registry.get_sample_value("switchyard_shadow_requests_total", ok) or 0.0) >= 1
    await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": None})


async def test_shadow_share_is_a_percent_and_the_old_fraction_is_taken_with_a_deprecation_note(
    client: httpx.AsyncClient,
) -> None:
    given = await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": 2, "percent": 10})
    assert (given.json()["routing"]["shadow"]["percent"], "deprecated" in given.json()) == (10.0, False)
    old = await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": 2, "sample": 0.2})
    assert old.status_code == 200, old.text
    assert old.json()["routing"]["shadow"]["percent"] == 20.0
    assert old.json()["deprecated"].startswith("'sample' (a fraction, 0-1) is deprecated: give 'percent' (0-100)")
    status = (await client.get("/admin/models/double", headers=ADMIN)).json()
    assert status["traffic"]["shadow"]["percent"] == 20.0
    both = await client.put("/admin/models/double/shadow", headers=ADMIN,
                            json={"version": 2, "percent": 10, "sample": 0.1})
    assert (both.status_code, both.json()["error"]) == (
        400, "give 'percent' (0-100), not both 'percent' and the deprecated 'sample'")
    await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": None})


async def test_policies_are_refused_with_400_when_malformed(client: httpx.AsyncClient) -> None:
    for policy, message in [
        ({"canary": 2, "weight": 150}, "'weight' must be a number from 0 to 100"),
        ({"canary": 2}, "'weight' is required"),
        ({"canary": 1, "weight": 10}, "is the stable version"),
        ({"canary": 2, "weight": 10, "rollback": {}}, "needs 'max_error_rate' and/or 'max_p99_ratio'"),
        ({"canary": 2, "weight": 10, "sticky_header": "bad header"}, "must be an HTTP header name"),
        ({"canary": 2, "weight": 10, "since": "now"}, "is set by the gateway"),
        ({"canary": 2, "weight": 10, "colour": "red"}, "unknown field(s) 'colour'"),
    ]:
        response = await traffic(client, policy)
        assert (response.status_code, message in response.json()["error"]) == (400, True), response.text
    missing = await traffic(client, {"canary": 9, "weight": 10})
    assert (missing.status_code, missing.json()["step"]) == (404, "load")


async def test_policies_survive_a_restart_when_persisted(client: httpx.AsyncClient, settings: Settings) -> None:
    await traffic(client, {"canary": 2, "weight": 25, "sticky_header": "X-User"})
    await client.put("/admin/models/double/shadow", headers=ADMIN, json={"version": 2, "percent": 50})
    persisted = json.loads(settings.state_path.read_text())["models"]["double"]  # type: ignore[union-attr]
    assert (persisted["canary"]["weight"], persisted["canary"]["sticky_header"]) == (25.0, "x-user")
    assert persisted["shadow"] == {"version": 2, "sample": 0.5}
