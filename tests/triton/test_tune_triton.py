"""``switchyard tune`` on the Triton backend, against a real local Triton: each trial config loads into Triton
under a private name beside the serving model (which keeps answering), none shows to the gateway's clients, and
every trial is unloaded from Triton, also when the gateway stops in the middle of a run or the run is cancelled."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient

from services.gateway.tuning.hosts import trial_name
from services.tritonlocal import LocalTriton
from tests.gateway_harness import RunningGateway
from tests.triton.support import gateway_settings, local_gateway
from tests.tuning_support import HEADERS, TOKEN, LeakWatch, run_status, start_run, tune
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # real trials in a real Triton, measured against the clock


@pytest.fixture
def admin_gateway(triton: LocalTriton, repository: Path) -> Iterator[RunningGateway]:
    with local_gateway(gateway_settings(triton.grpc_url, repository, admin_token=TOKEN)) as running:
        yield running


def ready_trials(triton: LocalTriton, model: str) -> list[str]:
    """Trial models of ``model`` Triton still serves (trials are numbered from 0, one per load)."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        return [trial_name(model, n) for n in range(40) if client.is_model_ready(trial_name(model, n))]


def test_tune_finds_winner_beside_serving_model_when_backend_is_triton(
    admin_gateway: RunningGateway, triton: LocalTriton, tmp_path: Path
) -> None:
    with LeakWatch(admin_gateway, "mlp") as watch:
        result = tune(
            admin_gateway, "mlp", "--p99-ms", "2000", "--json", "--budget-s", "15", "--duration", "0.3",
            "--concurrency", "1,4", folder=tmp_path,
        )
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    assert run["duration_s"] <= 15 + 5  # the budget, plus the last unload
    assert len(run["trials"]) >= 3
    assert [m["concurrency"] for m in run["winner"]["measurements"]] == [1, 4]
    assert all(m["p99_ms"] <= 2000 and m["errors"] == 0 for m in run["winner"]["measurements"])
    assert all(m["cpu_ms_per_request"] > 0 for m in run["winner"]["measurements"])
    # Server CPU is this gateway's and the local Triton's process group (its python-backend stubs included).
    pids = admin_gateway.app.state.manager.backend.trials().server_pids()
    assert triton.pid is not None
    assert triton.pid in pids
    assert watch.polls >= 5
    assert watch.leaks == []
    assert watch.failed_requests == []
    assert ready_trials(triton, "mlp") == []
    assert (tmp_path / "pareto.png").is_file()


def test_tune_unloads_trial_from_triton_when_gateway_stops_mid_run(
    triton: LocalTriton, repository: Path
) -> None:
    with local_gateway(gateway_settings(triton.grpc_url, repository, admin_token=TOKEN)) as gateway:
        assert start_run(gateway, "mlp", p99_ms=100, budget_s=60, duration_s=5).status_code == 202
        assert wait_until(lambda: bool(ready_trials(triton, "mlp")), 20)
    assert wait_until(lambda: not ready_trials(triton, "mlp"), 10)


def test_tune_in_place_puts_serving_config_back_when_run_ends(
    admin_gateway: RunningGateway, triton: LocalTriton, tmp_path: Path
) -> None:
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # what Triton serves 'mlp' with while the run goes on
        with grpcclient.InferenceServerClient(triton.grpc_url) as watcher:
            while not stop.is_set():
                seen.append(json.dumps(watcher.get_model_config("mlp", as_json=True)["config"], sort_keys=True))
                stop.wait(0.05)

    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        before = client.get_model_config("mlp", as_json=True)["config"]
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            result = tune(
                admin_gateway, "mlp", "--p99-ms", "2000", "--in-place", "--json", "--budget-s", "12",
                "--duration", "0.5", "--concurrency", "2", folder=tmp_path,  # 0.2 s: a stall under load answered none
            )
        finally:
            stop.set()
            watcher.join()
        assert result.exit_code == 0, result.output
        run = json.loads(result.stdout)
        assert run["options"]["in_place"] is True
        assert all(m["requests"] > 0 for t in run["trials"] for m in t["measurements"])
        # The trials ran as the serving model's own config (nothing loaded beside it), then it was put back.
        assert len(set(seen)) >= 2
        assert ready_trials(triton, "mlp") == []
        assert client.get_model_config("mlp", as_json=True)["config"] == before
        assert all(client.is_model_ready("mlp", str(v)) for v in (1, 2))


def test_tune_cancel_puts_serving_config_back_when_in_place_run_is_cancelled(
    admin_gateway: RunningGateway, triton: LocalTriton
) -> None:
    base = f"http://{admin_gateway.http_url}"
    routing = httpx.get(f"{base}/admin/models/mlp", headers=HEADERS).json()["routing"]
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        before = client.get_model_config("mlp", as_json=True)["config"]

        def trial_served() -> bool:  # Triton serves 'mlp' with a trial's config now
            run = run_status(admin_gateway, "mlp").json()
            return bool(run["in_progress"]) and client.get_model_config("mlp", as_json=True)["config"] != before

        started = start_run(admin_gateway, "mlp", p99_ms=2000, in_place=True, budget_s=60, duration_s=5,
                            concurrency=[2])
        assert started.status_code == 202, started.text
        assert wait_until(trial_served, 60), run_status(admin_gateway, "mlp").text
        cancelled = httpx.delete(f"{base}/admin/models/mlp/tune", headers=HEADERS, timeout=120)
        assert cancelled.status_code == 200, cancelled.text
        run = cancelled.json()
        assert run["status"] == "cancelled"
        assert run["in_progress"] is None, run
        # Answered once the serving config was loaded back: production runs on what it ran on before the run.
        assert client.get_model_config("mlp", as_json=True)["config"] == before
        assert all(client.is_model_ready("mlp", str(v)) for v in (1, 2))
    assert httpx.get(f"{base}/admin/models/mlp", headers=HEADERS).json()["routing"] == routing
    assert run_status(admin_gateway, "mlp").json()["status"] == "cancelled"
