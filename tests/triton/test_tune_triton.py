"""``switchyard tune`` on the Triton backend, against a real local Triton: each trial config loads into Triton
under a private name beside the serving model (which keeps answering), none shows to the gateway's clients, and
every trial is unloaded from Triton, also when the gateway stops in the middle of a run or the run is cancelled.
An in-place run whose serving config Triton does not take back (refused by a proxy in front of the real Triton) tries
again, and when it still fails says so everywhere an operator looks."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc.model_config_pb2 import ModelConfig

from services.gateway.backends.triton.trials import RESTORE_ATTEMPTS
from services.gateway.tuning.candidates import Candidate, current
from services.gateway.tuning.hosts import trial_name
from services.modelrepo.config import override_json, read_config
from services.ops.tune_views import cancelled_line
from services.tritonlocal import LocalTriton, TritonInstall, derive_config
from tests.gateway_harness import RunningGateway
from tests.triton.proxy import RecordingProxy
from tests.triton.support import gateway_settings, local_gateway, local_triton
from tests.tuning_support import HEADERS, TOKEN, LeakWatch, run_status, start_run, tune
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # real trials in a real Triton, measured against the clock


@pytest.fixture(scope="module")
def triton(install: TritonInstall, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    """A Triton of this file's own. The session's Triton may have another gateway in front of it (the ``gateway``
    fixture), whose health probe loads back the versions it serves when an in-place run's remedy unloads one."""
    with local_triton(repository, tmp_path_factory.mktemp("tune-triton"), install) as server:
        yield server


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
        run = json.loads(result.stdout)
        # What this test is about is the end of the run, found or not: on a loaded machine the small budget can end
        # before a setting was measured at every concurrency (seen once in CI), and the config must come back then too.
        assert result.exit_code == 0 or "budget measured no setting" in run["error"], result.output
        assert run["serving_config"] == {"restored": True}
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


_LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
REFUSAL = "failed to load 'mlp': out of memory (refused by the test proxy)"
TRIAL = "i1 d500us p[-] b32"
"""The one setting the in-place runs below measure: another than mlp's config.pbtxt (i2 d2000us p[-] b32)."""


class RefusingProxy(RecordingProxy):
    """The pass-through proxy in front of the real Triton that answers loads of ``model`` by a script once armed:
    each ``True`` refuses one load as Triton refuses a load it cannot do (``INTERNAL``, with a reason) before Triton
    sees it, each ``False`` lets one through; once the script is used up, every load goes through."""

    def __init__(self, target: str, model: str) -> None:
        super().__init__(target)
        self._model = model
        self._script: deque[bool] = deque()
        self._guard = threading.Lock()
        self.refused = 0

    def arm(self, *script: bool) -> None:
        with self._guard:
            self._script = deque(script)

    def forward(self, method: str, payload: bytes, context: grpc.ServicerContext) -> bytes:
        if method == _LOAD and service_pb2.RepositoryModelLoadRequest.FromString(payload).model_name == self._model:
            with self._guard:
                refuse = self._script.popleft() if self._script else False
                self.refused += refuse
            if refuse:
                context.abort(grpc.StatusCode.INTERNAL, REFUSAL)
        return super().forward(method, payload, context)


@pytest.fixture
def refusing(triton: LocalTriton) -> Iterator[RefusingProxy]:
    proxy = RefusingProxy(triton.grpc_url, "mlp")
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def proxied_gateway(refusing: RefusingProxy, repository: Path) -> Iterator[RunningGateway]:
    """The gateway (serving and trials alike) talking to the real Triton through ``refusing``."""
    settings = gateway_settings(f"127.0.0.1:{refusing.port}", repository, admin_token=TOKEN)
    with local_gateway(settings) as running:
        yield running


@pytest.fixture
def serving_config(triton: LocalTriton, repository: Path) -> Iterator[dict[str, Any]]:
    """mlp's config as Triton serves it before the test; put back after it, whatever the test left (the Triton is
    the session's)."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        before = but_versions(client.get_model_config("mlp", as_json=True)["config"])
        yield before
        if but_versions(client.get_model_config("mlp", as_json=True)["config"]) != before:
            twin = derive_config(read_config(repository / "mlp"))
            client.load_model("mlp", config=override_json(twin, {1, 2}))


def but_versions(config: dict[str, Any]) -> dict[str, Any]:
    """A config Triton reports, less its version policy: a load that only adds a version leaves the versions loaded
    before as they were, so their config still names the versions of their own load."""
    return {key: value for key, value in config.items() if key != "version_policy"}


def served_settings(triton: LocalTriton) -> tuple[int, int, int]:
    """Instances, queue delay and max batch size of the config Triton serves mlp with now, asked of Triton itself
    (the preferred batch sizes are left out: Triton completes a config without any with the max batch size)."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        config: ModelConfig = client.get_model_config("mlp").config
    return settings(current(config))


def settings(candidate: Candidate) -> tuple[int, int, int]:
    return candidate.instances, candidate.max_queue_delay_us, candidate.max_batch_size


def test_tune_in_place_loads_serving_config_again_when_triton_refuses_it_once(
    proxied_gateway: RunningGateway, refusing: RefusingProxy, triton: LocalTriton, serving_config: dict[str, Any],
    tmp_path: Path,
) -> None:
    refusing.arm(False, True)  # the trial's load goes through; the first load of the serving config back is refused
    result = tune(
        proxied_gateway, "mlp", "--p99-ms", "2000", "--in-place", "--candidate", TRIAL, "--json", "--budget-s", "15",
        "--duration", "0.5", "--concurrency", "2", folder=tmp_path,
    )
    # Tried again, the load went through: production is back on its own config, and the run says so.
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        assert but_versions(client.get_model_config("mlp", as_json=True)["config"]) == serving_config
        assert all(client.is_model_ready("mlp", str(v)) for v in (1, 2))
    assert refusing.refused == 1
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    assert (run["status"], run["serving_config"]) == ("succeeded", {"restored": True}), run["error"]


def test_tune_in_place_run_fails_naming_what_triton_serves_when_serving_config_cannot_be_loaded_back(
    proxied_gateway: RunningGateway, refusing: RefusingProxy, triton: LocalTriton, serving_config: dict[str, Any],
    tmp_path: Path,
) -> None:
    base = f"http://{proxied_gateway.http_url}"
    own = current(read_config(proxied_gateway.app.state.manager.catalog.entry("mlp").path))
    refusing.arm(False, *[True] * RESTORE_ATTEMPTS)  # the trial loads; every load of the serving config back fails
    result = tune(
        proxied_gateway, "mlp", "--p99-ms", "2000", "--in-place", "--candidate", TRIAL, "--json", "--budget-s", "15",
        "--duration", "0.5", "--concurrency", "2", folder=tmp_path,
    )
    # Production serves the trial's config still (Triton itself says so), and every place an operator looks says it.
    assert served_settings(triton) == settings(Candidate.parse(TRIAL)) != settings(own)
    assert result.exit_code == 1, result.output
    run = json.loads(result.stdout)
    assert run["status"] == "failed"
    assert refusing.refused == RESTORE_ATTEMPTS
    serving_now = (
        f"Triton serves version(s) 1, 2 of 'mlp' with the trial's settings ({TRIAL}), not its own ({own.label})"
    )
    assert run["winner"] is None
    assert run["serving_config"] == {
        "restored": False, "attempts": RESTORE_ATTEMPTS, "serving_now": serving_now,
        "error": f"loading model 'mlp' version(s) [1, 2] failed: {REFUSAL}",
    }
    assert run["error"].startswith(
        f"the serving config of model 'mlp' could not be loaded back into Triton after an in-place trial "
        f"({RESTORE_ATTEMPTS} attempts): loading model 'mlp' version(s) [1, 2] failed: {REFUSAL}; {serving_now}; "
    )
    assert result.stderr.strip().splitlines()[-1] == f"error: {run['error']}"
    assert [t["label"] for t in run["trials"]] == [TRIAL]  # what it measured is kept
    status = httpx.get(f"{base}/admin/models/mlp", headers=HEADERS).json()
    notes = {v["version"]: v["note"] for v in status["loaded"]}
    assert set(notes) == {1, 2}
    assert all(note.startswith(f"{serving_now}: tuning run {run['id']} could not load its own config back (")
               for note in notes.values()), notes
    events = httpx.get(f"{base}/admin/models/mlp/events", headers=HEADERS).json()["events"]
    tuned = [e for e in events if e["action"] == "tune"]
    assert [(e["result"], e["error"], e["detail"]["run"]) for e in tuned] == [("failed", run["error"], run["id"])]
    assert tuned[0]["detail"]["serving_config"] == run["serving_config"]
    # What the error says to do puts it back: an unload and a load of the version that is not the stable one.
    for action in ("unload", "load"):
        answer = httpx.post(f"{base}/admin/models/mlp/versions/1/{action}", headers=HEADERS, timeout=120)
        assert answer.status_code == 200, answer.text
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        assert but_versions(client.get_model_config("mlp", as_json=True)["config"]) == serving_config
        assert all(client.is_model_ready("mlp", str(v)) for v in (1, 2))
    # What was said of the trial's settings no longer holds once the model's own config is back, version 2's too.
    status = httpx.get(f"{base}/admin/models/mlp", headers=HEADERS).json()
    assert {v["version"]: v["note"] for v in status["loaded"]} == {1: None, 2: None}


def test_tune_cancel_says_serving_config_is_not_back_when_triton_refuses_it_after_in_place_run(
    proxied_gateway: RunningGateway, refusing: RefusingProxy, triton: LocalTriton, serving_config: dict[str, Any],
) -> None:
    base = f"http://{proxied_gateway.http_url}"
    refusing.arm(False, *[True] * RESTORE_ATTEMPTS)  # the trial loads; every load of the serving config back fails
    started = start_run(proxied_gateway, "mlp", p99_ms=2000, in_place=True, budget_s=60, duration_s=5,
                        concurrency=[2], candidates=[TRIAL])
    assert started.status_code == 202, started.text
    trial_served = settings(Candidate.parse(TRIAL))
    assert wait_until(lambda: served_settings(triton) == trial_served, 60, 0.05), run_status(proxied_gateway, "mlp")
    cancelled = httpx.delete(f"{base}/admin/models/mlp/tune", headers=HEADERS, timeout=120)
    assert cancelled.status_code == 200, cancelled.text
    run = cancelled.json()
    assert run["status"] == "cancelled"
    assert "; but the serving config of model 'mlp' could not be loaded back into Triton" in run["error"]
    assert run["serving_config"]["restored"] is False
    assert run["serving_config"]["error"] == f"loading model 'mlp' version(s) [1, 2] failed: {REFUSAL}"
    assert f"with the trial's settings ({TRIAL}), not its own" in run["serving_config"]["serving_now"]
    assert run["error"].startswith(f"cancelled by {run['cancelled']['by']} at {run['cancelled']['at']} while ")
    assert "was ended and unloaded" not in run["error"]
    # What `switchyard tune` prints of this answer when Ctrl-C cancelled its run.
    assert cancelled_line(run) == (
        f"error: tuning run {run['id']} of 'mlp' stopped while {run['cancelled']['phase']}; "
        f"{run['cancelled']['stopped']} was ended; 0 trials measured, nothing written; but the serving config could "
        f"not be loaded back into Triton ({RESTORE_ATTEMPTS} attempts): {run['serving_config']['error']}; "
        f"{run['serving_config']['serving_now']}"
    )
    assert served_settings(triton) == trial_served
    events = httpx.get(f"{base}/admin/models/mlp/events", headers=HEADERS).json()["events"]
    assert [(e["result"], e["error"], e["actor"]) for e in events if e["action"] == "tune"] == [
        ("failed", run["error"], run["cancelled"]["by"])
    ]
