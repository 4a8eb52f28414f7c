"""``switchyard serve --workers 2`` when a worker fails: it dies (SIGKILL), and the node's figures still count what
it did; it restarts while an admin action runs, and serves what the action reported; it hangs (SIGSTOP), and the
supervisor's watchdog kills it and starts another. The real CLI, a supervisor and
two spawned workers on shared ports, as in test_workers.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient

from services.gateway.state import RoutingRecord
from tests.gateway_process import GatewayProcess, gateway_process
from tests.integration.test_workers import BODY, FREE, OK_HTTP, on_new_connection, per_worker
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOKEN = "workers-failures-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
JOINED = "worker 1 of 2 joined the node"
HANG_TIMEOUT_S = 6  # the watchdog's; longer than test_an_activation_while_a_worker_restarts's stop of a worker


@pytest.fixture(scope="module")
def node(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("workers-failures")
    shutil.copytree(repository / "mlp", work / "repository" / "mlp")
    with gateway_process(work / "repository", work, token=TOKEN, options=("--workers", "2"),
                         api_keys="k-free-0123:free", log_level="info",
                         worker_hang_timeout_s=str(HANG_TIMEOUT_S)) as gateway:
        yield gateway


def worker_pids(gateway: GatewayProcess) -> dict[str, int]:
    """worker index -> the pid of its latest start."""
    return {index: int(pid) for index, pid in re.findall(r"worker (\d) started \(pid (\d+)\)", gateway.log.read_text())}


def kill_and_wait_for_restart(gateway: GatewayProcess, index: str) -> None:
    """SIGKILL worker ``index`` (as the OOM killer would) and wait until its next process serves the node."""
    pid = worker_pids(gateway)[index]
    os.kill(pid, signal.SIGKILL)
    url = f"http://{gateway.http_url}/v2/health/ready"
    assert wait_until(lambda: worker_pids(gateway)[index] != pid and httpx.get(url).status_code == 200, 120), \
        f"worker {index} was not restarted and ready within 120 s; the log:\n{gateway.log.read_text()[-3000:]}"


def http_statistics(gateway: GatewayProcess) -> dict[str, Any]:
    """mlp version 2's statistics (a new connection: either worker answers)."""
    answer = httpx.get(f"http://{gateway.http_url}/v2/models/mlp/versions/2/stats", headers=FREE)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    (stats,), (hop,) = body["model_stats"], body["gateway_stats"]
    return {"inference_count": stats["inference_count"], "execution_count": stats["execution_count"],
            "success": stats["inference_stats"]["success"]["count"],
            "batch_1": sum(b["compute_infer"]["count"] for b in stats["batch_stats"] if b["batch_size"] == 1),
            "served": hop["success"]["count"]}


def grpc_statistics(gateway: GatewayProcess) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    try:
        answer = client.get_inference_statistics("mlp", "2", headers={"x-api-key": FREE["X-API-Key"]})
    finally:
        client.close()
    (stats,) = answer.model_stats
    return {"inference_count": stats.inference_count, "execution_count": stats.execution_count,
            "success": stats.inference_stats.success.count,
            "batch_1": sum(b.compute_infer.count for b in stats.batch_stats if b.batch_size == 1)}


def test_statistics_never_go_backwards_when_a_worker_dies_and_count_every_request(node: GatewayProcess) -> None:
    started = http_statistics(node)  # each worker's warm-up, none served yet (the gateway's hop counts clients only)
    assert started["served"] == 0
    warmup = {figure: count // 2 for figure, count in started.items()}  # one worker process's warm-up
    sent = 0
    while sent < 40 or min(per_worker(node, OK_HTTP % "2").values(), default=0) < 5:  # both workers serve some
        assert sent < 400, f"the requests did not spread over both workers: {per_worker(node, OK_HTTP % '2')}"
        assert on_new_connection(node, FREE, BODY)[0] == 200
        sent += 1
    before = http_statistics(node)  # every worker reports (and keeps what it reported)
    assert before == {figure: count + sent for figure, count in started.items()}

    kill_and_wait_for_restart(node, "1")

    # The dead process's counts stay; its successor's warm-up is added, as every worker process's is.
    after = http_statistics(node)
    assert after == {figure: count + warmup[figure] for figure, count in before.items()}
    assert after["served"] == sent  # the requests the clients sent, every one counted once
    assert grpc_statistics(node) == {figure: count for figure, count in after.items() if figure != "served"}


def client_on_worker_0(gateway: GatewayProcess) -> httpx.Client:
    """A client whose kept-alive connection worker 0 took (the kernel spreads new connections over the workers)."""
    for _ in range(20):
        client = httpx.Client(base_url=f"http://{gateway.http_url}", headers={**FREE, **ADMIN}, timeout=60)
        before = per_worker(gateway, OK_HTTP % "2").get("0", 0)
        assert client.post("/v2/models/mlp/versions/2/infer", content=BODY).status_code == 200
        if per_worker(gateway, OK_HTTP % "2").get("0", 0) > before:
            return client
        client.close()
    raise AssertionError("no connection of 20 landed on worker 0")


def listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def activate_while_worker_1_joins(gateway: GatewayProcess, admin: httpx.Client, folder: Path) -> str | None:
    """Kill worker 1, stop its successor right after it joined the node (it asked worker 0 for the routing) and
    activate the other version through worker 0 meanwhile; the version activated, or None when the successor
    listened already when stopped (the moment is short: then try again)."""
    joined = gateway.log.read_text().count(JOINED)
    os.kill(worker_pids(gateway)["1"], signal.SIGKILL)
    assert wait_until(lambda: gateway.log.read_text().count(JOINED) > joined, 120, interval_s=0.001)
    successor = worker_pids(gateway)["1"]
    os.kill(successor, signal.SIGSTOP)
    try:
        if listening(folder / "worker-1.sock"):
            return None
        stable = admin.get("/admin/models/mlp").json()["routing"]["stable"]
        target = "1" if stable == 2 else "2"
        report = admin.post(f"/admin/models/mlp/versions/{target}/activate", json={})
        assert report.status_code == 200, report.text
        assert report.json()["result"] == "ok", report.text
        return target
    finally:
        os.kill(successor, signal.SIGCONT)
        ready = f"http://{gateway.http_url}/v2/health/ready"
        assert wait_until(lambda: httpx.get(ready).status_code == 200, 60)


def test_an_activation_while_a_worker_restarts_is_in_force_on_it_once_it_serves(node: GatewayProcess) -> None:
    """Worker 0 tells the others each routing it commits; a worker that restarts asks worker 0 for the routing as it
    joins the node, and only listens for worker 0's calls a moment later (its startup's last steps). An activation in
    that moment answered ok, and the restarted worker went on serving the previous version."""
    assert wait_until(lambda: "node's folder" in node.log.read_text())  # the supervisor's line once all are ready
    folder = Path(re.findall(r"node's folder (\S+)", node.log.read_text())[-1])
    admin = client_on_worker_0(node)
    try:
        target = None
        for _ in range(3):
            target = activate_while_worker_1_joins(node, admin, folder)
            if target is not None:
                break
        assert target is not None, "worker 1 listened already each time it was stopped after joining (3 tries)"
    finally:
        admin.close()
    answered: list[str | None] = []

    def every_worker_serves_it() -> bool:
        answered[:] = [on_new_connection(node, FREE)[1] for _ in range(20)]  # over both workers
        return set(answered) == {target}

    assert wait_until(every_worker_serves_it, 10), f"activated {target}; new connections got {answered}"


def test_a_hung_worker_is_killed_by_the_watchdog_and_started_again_then_every_request_is_answered(
    node: GatewayProcess,
) -> None:
    """A stopped worker keeps its listening sockets: the kernel goes on handing it its share of the new connections,
    and they wait unanswered until the watchdog kills it."""
    pid = worker_pids(node)["1"]
    os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: worker_pids(node)["1"] != pid, 60 + HANG_TIMEOUT_S), \
            f"the stopped worker 1 was not replaced; the log:\n{node.log.read_text()[-3000:]}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    log = node.log.read_text()
    assert f"worker 1 (pid {pid}) gave no sign of life for" in log
    assert f"SWITCHYARD_WORKER_HANG_TIMEOUT_S={HANG_TIMEOUT_S}): killing it" in log
    assert re.search(rf"worker 1 \(pid {pid}\) died with signal SIGKILL from the watchdog, its event loop silent "
                     r"for \d+ s; restarting it", log), log[-3000:]
    ready = f"http://{node.http_url}/v2/health/ready"
    assert wait_until(lambda: httpx.get(ready).status_code == 200, 120)

    answered = [on_new_connection(node, FREE)[0] for _ in range(40)]  # the kernel spreads them over both workers

    assert answered == [200] * 40


def test_a_routing_worker_0_persisted_but_did_not_tell_before_dying_reaches_every_worker_once_it_restarts(
    node: GatewayProcess,
) -> None:
    """Worker 0 persists an action's routing, then tells the others; killed between the two (a window of about a
    millisecond, so the test writes the routing file itself, as worker 0 does, then kills it), the restarted
    worker 0 serves the persisted routing and must tell the others, which would serve the previous one."""
    state = Path(node.env["SWITCHYARD_STATE_PATH"])
    document = json.loads(state.read_text())
    before = RoutingRecord.from_json(document["models"]["mlp"])
    assert set(before.loaded) >= {1, 2}  # both versions stay loaded: switching is a routing change only
    target = 1 if before.stable == 2 else 2
    document["models"]["mlp"] = before.switched_to(target).to_json()
    state.write_text(json.dumps(document, indent=2) + "\n")

    kill_and_wait_for_restart(node, "0")

    answered: list[str | None] = []

    def every_worker_serves_it() -> bool:
        answered[:] = [on_new_connection(node, FREE)[1] for _ in range(20)]  # over both workers
        return set(answered) == {str(target)}

    assert wait_until(every_worker_serves_it, 30), f"persisted version {target}; new connections got {answered}"
