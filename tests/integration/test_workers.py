"""``switchyard serve --workers 2`` as users run it (the real CLI, a supervisor and two spawned workers on shared
ports): one routing state, one set of figures, node-wide rate limits, a killed worker restarted while the other
serves."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient

from examples import models
from tests.gateway_process import GatewayProcess, gateway_process
from tests.shm_support import shm_object
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOKEN = "workers-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
FREE = {"X-API-Key": "k-free-0123"}
LIMITED = {"X-API-Key": "k-limited-4567"}
LIMITS = """
[tenants.limited]
rps = 2
burst = 6
"""


@pytest.fixture(scope="module")
def node(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("workers")
    shutil.copytree(repository / "mlp", work / "repository" / "mlp")
    (work / "limits.toml").write_text(LIMITS)
    with gateway_process(work / "repository", work, token=TOKEN, options=("--workers", "2"),
                         api_keys="k-free-0123:free,k-limited-4567:limited", limits_file=str(work / "limits.toml"),
                         shared_memory="true", log_level="info") as gateway:
        yield gateway


def body() -> dict[str, object]:
    features = models.mlp_inputs(1, seed=3).numpy().ravel().tolist()
    return {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": features}]}


BODY = json.dumps(body())


def on_new_connection(gateway: GatewayProcess, headers: dict[str, str], body: str = BODY) -> tuple[int, str | None]:
    """One inference on a connection of its own (the kernel picks the worker): status and the answering version.
    ``http.client``: a fresh httpx client costs ~10 ms (its TLS context), enough to slow the test tenfold."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.http_port, timeout=30)
    try:
        connection.request("POST", "/v2/models/mlp/infer", body, {**headers, "Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        return answer.status, answer.getheader("x-model-version")
    finally:
        connection.close()


def per_worker(gateway: GatewayProcess, series: str) -> dict[str, float]:
    """worker -> value of ``series`` (a full sample name with labels, less the worker label)."""
    text = httpx.get(f"http://{gateway.http_url}/metrics", params={"workers": "each"}).text
    found: dict[str, float] = {}
    name, _, labels = series.partition("{")
    for line in text.splitlines():
        match = re.match(r'(\w+)\{(.*),worker="(\d+)"\} (\S+)$', line)
        if match and match[1] == name and match[2] == labels.rstrip("}"):
            found[match[3]] = float(match[4])
    return found


def node_total(gateway: GatewayProcess, series: str) -> float:
    for line in httpx.get(f"http://{gateway.http_url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


OK_HTTP = 'switchyard_requests_total{code="200",model="mlp",protocol="http",version="%s"}'


def test_an_activation_through_any_worker_is_in_force_on_every_worker_when_it_returns(node: GatewayProcess) -> None:
    url = f"http://{node.http_url}"
    answers: list[tuple[float, str]] = []  # (when the request was sent, the version that answered)
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            status, version = on_new_connection(node, FREE)  # a connection each: spread over the workers
            assert status == 200
            assert version is not None
            answers.append((sent, version))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    switches: list[tuple[float, float, str]] = []  # (call sent, call returned, version activated)
    try:
        for target in ("1", "2", "1", "2"):
            time.sleep(0.3)
            called = time.monotonic()
            with httpx.Client(base_url=url, headers=ADMIN) as admin:  # lands on either worker
                report = admin.post(f"/admin/models/mlp/versions/{target}/activate", json={}, timeout=120).json()
            switches.append((called, time.monotonic(), target))
            assert report["result"] == "ok", report
            assert set(report["workers"]) == {"1"}  # the other worker's steps, reported
            assert "follow" in report["workers"]["1"], report["workers"]
        while len(answers) < 1000:
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    # A request sent after an activation returned, and before the next one was called, must see its version (one
    # sent while an activation runs may see either).
    next_calls = [called for called, _, _ in switches[1:]] + [float("inf")]
    windows = [(returned, next_call, target) for (_, returned, target), next_call in zip(switches, next_calls,
                                                                                          strict=True)]
    stale = [(sent, version) for sent, version in answers
             for start, end, target in windows if start <= sent < end and version != target]
    settled = sum(1 for sent, _ in answers for start, end, _ in windows if start <= sent < end)
    print(f"\n{len(answers)} requests across {len(switches)} activations ({settled} sent after one returned and "
          f"before the next was called), {len(stale)} stale")
    assert stale == []
    served = per_worker(node, OK_HTTP % "1")
    assert set(served) == {"0", "1"}  # both workers took the traffic
    assert min(served.values()) > 0


def test_metrics_from_any_worker_count_the_whole_node(node: GatewayProcess) -> None:
    series = OK_HTTP % "2"
    before = node_total(node, series)
    for _ in range(60):
        assert on_new_connection(node, FREE)[0] == 200
    for _ in range(4):  # each answer comes from whichever worker took the scrape's connection
        assert node_total(node, series) - before == 60
    each = per_worker(node, series)
    assert sum(each.values()) == node_total(node, series)


def test_the_consoles_live_figures_count_the_whole_node(node: GatewayProcess) -> None:
    live = f"http://{node.http_url}/admin/models/mlp/live"

    def read_after(moment: float) -> list[dict[str, Any]]:
        """The live points, once worker 0 has taken a reading after ``moment`` (it reads every second while watched)."""
        found: list[dict[str, Any]] = []

        def taken() -> bool:
            series = httpx.get(live, headers=ADMIN, params={"minutes": 1, "step": 1}).json()
            found[:] = [point for version in series["versions"] for point in version["points"]]
            return any(float(point["t"]) > moment for point in found)

        assert wait_until(taken), "no live reading came"
        return found

    assert on_new_connection(node, FREE)[0] == 200  # a version with figures: the series lists points under it
    # Watched now, and a reading that counts that request: a second on, as the reading a moment after its answer
    # may come before the request is counted, and the next one would count it among the 200.
    read_after(time.time() + 1.0)
    sent_after = time.time()
    for _ in range(200):
        assert on_new_connection(node, FREE)[0] == 200  # over both workers
    points = read_after(time.time())  # a reading after it
    counted = sum(int(point["requests"]) for point in points if float(point["t"]) > sent_after)
    assert counted == 200  # worker 0's own figures would hold only its share


def test_the_consoles_bulk_read_is_the_nodes_view_through_either_worker(node: GatewayProcess) -> None:
    """``GET /admin/console/models`` (the console's one read per poll) is answered by worker 0 for the node, as the
    per-model reads are: its live figures count both workers' requests, through whichever worker takes the call."""
    bulk = f"http://{node.http_url}/admin/console/models"

    def mlp() -> dict[str, Any]:
        (model,) = httpx.get(bulk, headers=ADMIN, params={"minutes": 1, "step": 1}).json()["models"]
        assert model["name"] == "mlp"
        return dict(model)

    def counted_after(moment: float) -> int:
        return sum(int(point["requests"]) for version in mlp()["live"]["versions"] for point in version["points"]
                   if float(point["t"]) > moment)

    def read_since(moment: float) -> bool:
        """Worker 0 has taken a reading after ``moment`` (it reads every second while watched; the shadow's list has
        a point per reading, whatever was served)."""
        return any(float(point["t"]) > moment for point in mlp()["live"]["shadow"])

    assert wait_until(lambda: read_since(time.time())), "no live reading came"  # watched now, a reading before
    sent_after = time.time()
    for _ in range(200):
        assert on_new_connection(node, FREE)[0] == 200  # over both workers
    assert wait_until(lambda: read_since(time.time())), "no live reading came"
    # A connection each: the kernel hands them to either worker, and each answer counts the node's 200.
    assert [counted_after(sent_after) for _ in range(6)] == [200] * 6
    status = httpx.get(f"http://{node.http_url}/admin/models/mlp", headers=ADMIN).json()
    assert mlp()["status"]["routing"] == status["routing"]


def test_a_rate_limit_holds_for_the_node_not_each_worker(node: GatewayProcess) -> None:
    allowed = refused = 0
    started = time.monotonic()
    for _ in range(30):
        status, _ = on_new_connection(node, LIMITED)
        allowed += status == 200
        refused += status == 429
    elapsed = time.monotonic() - started
    # burst 6, then 2/s for the node; two per-worker buckets would let about twice that through
    assert allowed <= 6 + 2 * elapsed + 1, (allowed, elapsed)
    assert allowed + refused == 30
    rejected = per_worker(node, 'switchyard_rejected_total{model="mlp",reason="rate_limit"}')
    assert set(rejected) == {"0", "1"}  # both workers refused: the shared bucket, not one worker's


def test_a_shared_memory_region_registered_through_one_worker_serves_on_every_worker(node: GatewayProcess) -> None:
    features = models.mlp_inputs(1, seed=3).numpy()
    with shm_object(features.nbytes) as region:
        region.put(features)
        with httpx.Client(base_url=f"http://{node.http_url}", headers=FREE) as client:
            registered = client.post("/v2/systemsharedmemory/region/features/register",
                                     json={"key": region.key, "offset": 0, "byte_size": features.nbytes})
            assert registered.status_code == 200, registered.text
        request = json.dumps({"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "parameters": {
            "shared_memory_region": "features", "shared_memory_byte_size": features.nbytes}}]})
        statuses = [on_new_connection(node, FREE, request)[0] for _ in range(40)]  # both workers serve some
        assert statuses == [200] * 40
        with httpx.Client(base_url=f"http://{node.http_url}", headers=FREE) as client:
            assert client.post("/v2/systemsharedmemory/region/features/unregister").status_code == 200
        assert {on_new_connection(node, FREE, request)[0] for _ in range(20)} == {400}  # gone from every worker


def test_repository_loads_and_unloads_over_grpc_through_either_worker_reach_the_whole_node(
    node: GatewayProcess,
) -> None:
    for action in ("unload", "load") * 3:
        client = grpcclient.InferenceServerClient(node.grpc_url)  # a channel each: either worker takes the call
        try:
            getattr(client, f"{action}_model")("mlp", headers={"authorization": ADMIN["Authorization"]})
        finally:
            client.close()
        want = 404 if action == "unload" else 200  # an unloaded model is unknown to inference, as in Triton
        # Every worker answers alike before the call returned: no new connection sees the other state.
        statuses = {on_new_connection(node, FREE)[0] for _ in range(20)}
        assert statuses == {want}, (action, statuses)


def test_a_killed_worker_is_restarted_while_the_other_serves_without_a_failure(node: GatewayProcess) -> None:
    pids = dict(re.findall(r"worker (\d) started \(pid (\d+)\)", node.log.read_text()))
    before = per_worker(node, OK_HTTP % "2")
    clients = [httpx.Client(base_url=f"http://{node.http_url}", headers=FREE) for _ in range(8)]
    try:
        on_worker_0 = []
        for client in clients:  # which worker holds each kept-alive connection
            counts = per_worker(node, OK_HTTP % "2")
            assert client.post("/v2/models/mlp/infer", json=body()).status_code == 200
            after = per_worker(node, OK_HTTP % "2")
            if after.get("0", 0) > counts.get("0", 0):
                on_worker_0.append(client)
        assert on_worker_0, f"no connection landed on worker 0 ({before})"
        counted_before = node_total(node, OK_HTTP % "2")  # both workers report, and keep what they reported
        os.kill(int(pids["1"]), signal.SIGKILL)
        # A new connection the kernel routes to the dying worker's listener in its last moments is reset with it
        # (SO_REUSEPORT's known race, which no server closes); it may still show right after the process is gone.
        # Once a new connection has been answered, nothing may fail; the connections worker 0 holds never may.
        while _alive(int(pids["1"])):
            time.sleep(0.01)
        failures: list[str] = []
        served_since = 0
        lost_in_the_race = 0
        answered_since = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for client in on_worker_0:
                answer = client.post("/v2/models/mlp/infer", json=body())
                if answer.status_code != 200:
                    failures.append(answer.text)
                else:
                    served_since += 1
            try:
                status = on_new_connection(node, FREE)[0]  # only worker 0 listens until 1 is back
            except ConnectionResetError:
                if answered_since:
                    raise
                lost_in_the_race += 1
            else:
                answered_since = True
                if status != 200:
                    failures.append(f"a new connection: {status}")
                else:
                    served_since += 1
            restarted = dict(re.findall(r"worker (\d) started \(pid (\d+)\)", node.log.read_text()))
            if restarted["1"] != pids["1"] and httpx.get(f"http://{node.http_url}/v2/health/ready").status_code == 200:
                break
            time.sleep(0.05)
        print(f"\n{lost_in_the_race} new connection(s) reset as worker 1 died")
        assert lost_in_the_race <= 1
        assert failures == []
        assert restarted["1"] != pids["1"], "worker 1 was not restarted"
        assert f"worker 1 (pid {pids['1']}) died with signal SIGKILL" in node.log.read_text()
        assert node_total(node, "switchyard_worker_restarts") == 1  # counted, and shown by the node
        # The node's counters never go backwards: the dead process's last report stays in the sum.
        assert node_total(node, OK_HTTP % "2") == counted_before + served_since
    finally:
        for client in clients:
            client.close()


def test_sigterm_stops_every_worker_and_the_supervisor_cleanly(node: GatewayProcess) -> None:
    pids = [int(pid) for _, pid in re.findall(r"worker (\d) started \(pid (\d+)\)", node.log.read_text())]
    folder = re.findall(r"node's folder (\S+)", node.log.read_text())
    node.stop()  # SIGTERM to the supervisor, as a container runtime sends it
    assert node.process is not None
    assert node.process.returncode == 0
    assert not any(_alive(pid) for pid in pids)
    assert "node stopped: 2 workers, 1 restarts" in node.log.read_text()
    assert folder
    assert not Path(folder[-1]).exists()


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has closed its sockets: it does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status
