"""Two gateway replicas sharing routing through a real redis-server: a switch on one is followed by the other
within a second, both come back with the same routing after a restart, concurrent actions get one 200 and one
409, and with Redis gone both keep serving (admin changes answer 503) until it returns and they resynchronise."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples import models
from tests.gateway_process import GatewayProcess, gateway_process
from tests.redis_server import RedisServer, redis_server
from tests.waiting import eventually_async, wait_until

TOKEN = "replica-test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def mlp_body() -> dict[str, object]:
    features = models.mlp_inputs(1, seed=4).numpy().ravel().tolist()
    return {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}


def stable(gateway: GatewayProcess, model: str) -> int:
    return int(httpx.get(f"http://{gateway.http_url}/admin/models/{model}", headers=ADMIN).json()["routing"]["stable"])


def served(gateway: GatewayProcess) -> str:
    answer = httpx.post(f"http://{gateway.http_url}/v2/models/mlp/infer", json=mlp_body())
    assert answer.status_code == 200, answer.text
    return answer.headers["x-model-version"]


def wait_for_stable(gateway: GatewayProcess, model: str, version: int, timeout_s: float = 5.0) -> float:
    started = time.monotonic()
    while stable(gateway, model) != version:
        assert time.monotonic() - started < timeout_s, f"{gateway.http_url} did not follow to {model} {version}"
        time.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture
def cluster(repository: Path, tmp_path: Path) -> Iterator[tuple[RedisServer, GatewayProcess, GatewayProcess]]:
    root = tmp_path / "repository"
    for model in ("classifier", "mlp"):
        shutil.copytree(repository / model, root / model)
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp_path / "redis"))
        replicas = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replica = gateway_process(root, tmp_path / name, token=TOKEN, redis_url=redis.url)
            replicas.append(stack.enter_context(replica))
        yield redis, replicas[0], replicas[1]


@pytest.mark.slow
def test_replicas_follow_each_other_and_survive_restarts_and_a_redis_outage(
    cluster: tuple[RedisServer, GatewayProcess, GatewayProcess],
) -> None:
    redis, a, b = cluster
    assert stable(a, "mlp") == stable(b, "mlp") == 2

    switched = httpx.post(f"http://{a.http_url}/admin/models/mlp/versions/1/activate", headers=ADMIN)
    assert switched.status_code == 200, switched.text
    followed_s = wait_for_stable(b, "mlp", 1)
    assert followed_s < 1.0
    assert served(b) == "1"

    # Concurrent actions on one model: one replica holds the lock for the whole swap, the other gets 409.
    assert httpx.post(f"http://{a.http_url}/admin/models/classifier/versions/1/unload", headers=ADMIN).is_success

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60.0) as http:
            first = asyncio.create_task(
                http.post(f"http://{a.http_url}/admin/models/classifier/versions/1/activate", headers=ADMIN)
            )

            async def a_is_swapping() -> bool:  # loading and warming version 1 up (it unloaded it)
                status = await http.get(f"http://{a.http_url}/admin/models/classifier", headers=ADMIN)
                return first.done() or status.json()["action"] is not None

            assert await eventually_async(a_is_swapping, True)
            second = await http.post(f"http://{b.http_url}/admin/models/classifier/versions/1/activate",
                                     headers=ADMIN)
            return [await first, second]

    first, second = asyncio.run(both())
    assert (first.status_code, second.status_code) == (200, 409), (first.text, second.text)
    assert "busy on another gateway" in second.json()["error"]
    wait_for_stable(b, "classifier", 1)

    a.stop()
    b.stop()
    a.start()
    b.start()
    assert (stable(a, "mlp"), stable(b, "mlp"), stable(a, "classifier"), stable(b, "classifier")) == (1, 1, 1, 1)
    # The record names the exports it routes to, through Redis and back: the same files, the same routing.
    exports = [httpx.get(f"http://{g.http_url}/admin/models/mlp", headers=ADMIN).json()["routing"]["exports"]
               for g in (a, b)]
    assert exports[0] == exports[1]
    assert set(exports[0]) == {"1", "2"}, exports
    assert all(" sha256:" in identity and " exported " in identity for identity in exports[0].values()), exports

    redis.kill()
    assert served(a) == served(b) == "1"  # the last routing known keeps serving
    refused = httpx.post(f"http://{a.http_url}/admin/models/mlp/rollback", headers=ADMIN)
    assert refused.status_code == 503
    assert "unreachable" in refused.json()["error"]
    redis.start()
    deadline = time.monotonic() + 10
    while True:  # the replicas reconnect by themselves
        back = httpx.post(f"http://{b.http_url}/admin/models/mlp/rollback", headers=ADMIN)
        if back.status_code == 200:
            break
        assert time.monotonic() < deadline, back.text
        time.sleep(0.2)
    wait_for_stable(a, "mlp", 2, timeout_s=2.0)
    assert served(a) == served(b) == "2"
    print(f"\nreplica B followed a switch on A in {followed_s * 1e3:.0f} ms")


@pytest.mark.slow
def test_replicas_with_a_model_cache_share_the_routing_and_each_loads_only_for_its_own_requests(
    repository: Path, tmp_path: Path
) -> None:
    """Routing stays shared through Redis; what is loaded is each replica's own: an activation through one replica
    routes the other, which loads the new version only when a request of its own asks for it."""
    root = tmp_path / "repository"
    shutil.copytree(repository / "mlp", root / "mlp")

    def resident(gateway: GatewayProcess) -> bool:
        answer = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=ADMIN).json()
        return bool(answer["cache"]["resident"])

    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp_path / "redis"))
        replicas = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            replicas.append(stack.enter_context(
                gateway_process(root, tmp_path / name, token=TOKEN, redis_url=redis.url, model_cache_mb="200")
            ))
        a, b = replicas
        assert (resident(a), resident(b)) == (False, False)  # routed at start, loaded by no one yet
        assert served(a) == "2"
        assert (resident(a), resident(b)) == (True, False)

        switched = httpx.post(f"http://{a.http_url}/admin/models/mlp/versions/1/activate", headers=ADMIN)
        assert switched.status_code == 200, switched.text
        wait_for_stable(b, "mlp", 1)
        assert resident(b) is False  # b follows the routing without loading version 1 for nobody
        assert served(b) == "1"
        assert resident(b) is True
        assert served(a) == "1"


@pytest.mark.slow
def test_a_replica_whose_repository_lacks_a_version_kept_loaded_elsewhere_follows_the_shared_routing(
    repository: Path, tmp_path: Path
) -> None:
    """Replica B's copy of the repository was pruned to version 2; replica A keeps version 1 loaded beside the stable
    version 2. Both route requests alike, so B follows the shared routing, at its start and after each action, and
    says nothing is wrong; only an action that routes to version 1 cannot be followed by B."""
    for name, versions in (("a", ("1", "2")), ("b", ("2",))):
        root = tmp_path / name / "repository" / "mlp"
        root.mkdir(parents=True)
        for item in ("config.pbtxt", "warmup", *versions):
            source = repository / "mlp" / item
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / item)

    def view(gateway: GatewayProcess) -> dict[str, Any]:
        answer = httpx.get(f"http://{gateway.http_url}/admin/models/mlp", headers=ADMIN)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    with ExitStack() as stack:
        redis = stack.enter_context(redis_server(tmp_path / "redis"))
        a, b = (stack.enter_context(gateway_process(tmp_path / name / "repository", tmp_path / name, token=TOKEN,
                                                    redis_url=redis.url)) for name in ("a", "b"))
        assert view(a)["routing"]["loaded"] == [1, 2]
        started = view(b)
        assert (started["routing"]["generation"], started["problem"]) == (view(a)["routing"]["generation"], None)
        assert served(b) == "2"

        for action in ("unload", "load"):  # a new generation each, the last keeping version 1 loaded again
            done = httpx.post(f"http://{a.http_url}/admin/models/mlp/versions/1/{action}", headers=ADMIN)
            assert done.status_code == 200, done.text
        generation = view(a)["routing"]["generation"]
        assert view(a)["routing"]["loaded"] == [1, 2]

        assert wait_until(lambda: view(b)["routing"]["generation"] == generation, 10), view(b)
        assert view(b)["problem"] is None
        assert served(b) == "2"


@pytest.mark.slow
def test_replicas_show_the_audit_events_recorded_during_a_redis_outage_in_order_with_their_times_once_it_returns(
    cluster: tuple[RedisServer, GatewayProcess, GatewayProcess], tmp_path: Path
) -> None:
    """What an operator reads after an outage has no gap where things happened: each replica kept the events it
    recorded while Redis was down and wrote them once it was back, each with the time it happened, once."""
    import datetime as dt  # only this test reads clocks

    redis, a, b = cluster
    root = tmp_path / "repository"

    def new_version(gateway: GatewayProcess, version: int) -> None:
        """A version appears on disk (moved in whole, as an operator would) and the gateway's scan lists it: a
        ``scan`` event."""
        if not (root / "mlp" / str(version)).exists():
            shutil.copytree(root / "mlp" / "2", tmp_path / f"incoming-{version}")
            (tmp_path / f"incoming-{version}").rename(root / "mlp" / str(version))
        scanned = httpx.post(f"http://{gateway.http_url}/admin/repository/scan", headers=ADMIN)
        assert scanned.status_code == 200, scanned.text
        assert scanned.json()["new_versions"] == {"mlp": [version]}, scanned.text

    def scans(gateway: GatewayProcess) -> list[tuple[str, list[int], str]]:
        """The ``scan`` events a replica reads (time, new versions, its pending mark: absent once shared)."""
        answer = httpx.get(f"http://{gateway.http_url}/admin/models/mlp/events", headers=ADMIN)
        if answer.status_code != 200:
            return []
        return [(e["time"], e["detail"]["new_versions"], str(e.get("pending", "shared")))
                for e in answer.json()["events"] if e["action"] == "scan"]

    down_at = dt.datetime.now(dt.UTC)
    redis.kill()
    new_version(a, 3)
    new_version(b, 3)
    new_version(a, 4)
    back_at = dt.datetime.now(dt.UTC)
    unread = httpx.get(f"http://{a.http_url}/admin/models/mlp/events", headers=ADMIN)
    assert unread.status_code == 503, unread.text  # not a traceback: the log cannot be read, and how much is kept
    assert unread.json()["error"].startswith("the audit log cannot be read: "), unread.text
    pending = re.search(r"^switchyard_audit_events_pending (\S+)$", httpx.get(f"http://{a.http_url}/metrics").text,
                        re.MULTILINE)
    assert pending is not None
    assert float(pending[1]) == 2  # a's two scans wait for Redis
    refused = httpx.post(f"http://{a.http_url}/admin/models/mlp/versions/1/activate", headers=ADMIN)
    assert refused.status_code == 503, refused.text  # its lock is in Redis: refused, and recorded as such
    redis.start()

    def both_show_three() -> bool:
        return len(scans(a)) == len(scans(b)) == 3

    assert wait_until(both_show_three, 10, interval_s=0.1), (scans(a), scans(b))
    shown = scans(a)
    assert scans(b) == shown
    assert [(versions, mark) for _, versions, mark in shown] == [([3], "shared"), ([3], "shared"), ([4], "shared")]
    times = [dt.datetime.fromisoformat(time) for time, _, _ in shown]
    assert down_at <= times[0] <= times[1] <= times[2] <= back_at, shown
    events = httpx.get(f"http://{b.http_url}/admin/models/mlp/events", headers=ADMIN).json()["events"]
    (lock_refused,) = [e for e in events if e["action"] == "activate" and e["result"] == "failed"]
    assert (lock_refused["step"], lock_refused["versions"]) == ("lock", {"version": 1})
    assert lock_refused["actor"].startswith("token:")
    assert lock_refused["error"].startswith("activate refused: "), lock_refused
