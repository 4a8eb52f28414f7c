"""The model cache in front of the real local Triton (explicit model control): six copies of the example mlp, each
declaring 150 MiB, under a 400 MiB budget (two fit), plus one copy that declares nothing. Traffic over the copies
fails no request, and Triton itself never holds more READY than the budget allows and holds exactly what the cache
counts as resident: the copies the cache unloaded are unloaded in Triton. The cost counted on a Triton of this host is
what its process tree grew by (``measured``), the declaration when that is larger (``declared``, a floor); a version
measured over the whole budget is refused with 507, and its next request is refused without loading it again."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import tritonclient.grpc as grpcclient

from services.gateway.capacity.memory import DECLARED as MEMORY_PARAMETER
from services.modelrepo.config import read_config, to_text
from services.modelrepo.layout import CONFIG_FILE
from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_harness import RunningGateway
from tests.triton.support import gateway_settings, local_gateway, local_triton

pytestmark = pytest.mark.slow  # a local Triton of its own: the copies must be in what it serves

DECLARED = [f"m{number}" for number in range(6)]
UNDECLARED = "plain"
ALL = [*DECLARED, UNDECLARED]
DECLARED_MB = 150
"""Above what one copy measures in this Triton (its python-backend stub: about 75 MiB), so that the declaration is
the figure counted."""
BUDGET_MB = 400
FIT = 2
"""How many declared copies the budget holds (2 x 150 <= 400 < 3 x 150), with room beside them for the undeclared
copy's measured cost."""
TOKEN = "model-cache-triton-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
BODY = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}]}
TRAFFIC_S = 2.5
CLIENTS = 3
REQUESTS_PER_MODEL = 3
"""A client sends this many requests to one copy before it moves to the next: hits beside the misses."""
MIB = 1024 * 1024


def copy_mlp(source: Path, root: Path, name: str, declared_mb: float | None) -> None:
    """The example mlp as ``name``, declaring ``declared_mb`` when given. One instance and no dynamic batching: the
    python backend takes about a second to stop each instance's stub, and every eviction waits for that; one
    instance with dynamic batching would hold requests (``warn_if_single_instance``)."""
    config = read_config(source / "mlp")
    config.name = name
    del config.instance_group[1:]
    config.instance_group[0].count = 1
    config.ClearField("dynamic_batching")
    if declared_mb is not None:
        config.parameters[MEMORY_PARAMETER].string_value = str(declared_mb)
    shutil.copytree(source / "mlp", root / name, ignore=shutil.ignore_patterns(CONFIG_FILE))
    (root / name / CONFIG_FILE).write_text(to_text(config))


@pytest.fixture(scope="module")
def copies(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model_cache_triton") / "repository"
    for name in DECLARED:
        copy_mlp(repository, root, name, DECLARED_MB)
    copy_mlp(repository, root, UNDECLARED, None)
    return root


@pytest.fixture(scope="module")
def triton_of_copies(install: TritonInstall, copies: Path) -> Iterator[LocalTriton]:
    """Triton serves its derived twin of ``copies`` (built as it starts), started empty: the cache loads on demand."""
    with local_triton(copies, copies.parent, install) as server:
        yield server


@pytest.fixture(scope="module")
def cached(triton_of_copies: LocalTriton, copies: Path) -> Iterator[RunningGateway]:
    settings = gateway_settings(triton_of_copies.grpc_url, copies, model_cache_mb=BUDGET_MB, model_min_residency_s=0,
                                admin_token=TOKEN)
    with local_gateway(settings) as running:
        yield running


def ready_in_triton(client: grpcclient.InferenceServerClient) -> set[tuple[str, str]]:
    """(model, version) READY in Triton's own repository index."""
    index = client.get_model_repository_index(as_json=True, client_timeout=5.0).get("models", [])
    return {(entry["name"], entry.get("version", "")) for entry in index if entry.get("state") == "READY"}


def triton_mb(server: LocalTriton) -> float:
    """The resident memory of tritonserver and its python-backend stubs (processes of their own)."""
    assert server.pid is not None
    process = psutil.Process(server.pid)
    return sum(member.memory_info().rss for member in [process, *process.children(recursive=True)]) / MIB


def test_traffic_over_more_copies_than_fit_fails_no_request_and_triton_holds_only_what_the_cache_counts(
    cached: RunningGateway, triton_of_copies: LocalTriton
) -> None:
    cache = cached.app.state.dataplane.cache
    evictions_before = cached.metric("switchyard_model_cache_evictions_total", reason="capacity")
    failures: list[str] = []
    samples: list[set[tuple[str, str]]] = []
    clients_done, sampling_done = threading.Event(), threading.Event()

    def client(first: int) -> None:
        # Each client starts on a copy of its own (m0, m2, m4): a third copy is asked for before any request ends.
        position = first * REQUESTS_PER_MODEL
        with httpx.Client(base_url=f"http://{cached.http_url}", timeout=60, trust_env=False) as http:
            while not clients_done.is_set():
                model = DECLARED[position // REQUESTS_PER_MODEL % len(DECLARED)]
                try:
                    answer = http.post(f"/v2/models/{model}/infer", json=BODY)
                except httpx.HTTPError as exc:
                    failures.append(f"{model}: {exc!r}")
                    return
                if answer.status_code != 200:
                    failures.append(f"{model}: {answer.status_code} {answer.text[:300]}")
                position += 1

    def sample_triton() -> None:
        with grpcclient.InferenceServerClient(triton_of_copies.grpc_url) as direct:
            while not sampling_done.is_set():
                samples.append(ready_in_triton(direct))
                time.sleep(0.05)

    sampler = threading.Thread(target=sample_triton)
    sampler.start()
    clients = [threading.Thread(target=client, args=(2 * number,)) for number in range(CLIENTS)]
    for thread in clients:
        thread.start()
    time.sleep(TRAFFIC_S)  # the traffic's length: then each client ends with the request it has under way
    clients_done.set()
    for thread in clients:
        thread.join(60)
    sampling_done.set()
    sampler.join(10)

    assert not any(thread.is_alive() for thread in [*clients, sampler])
    assert failures == []
    loads = {model: cached.metric("switchyard_model_cache_load_seconds_count", model=model) for model in ALL}
    evictions = cached.metric("switchyard_model_cache_evictions_total", reason="capacity")
    resident = set(cache.residents)
    assert sum(loads[model] for model in DECLARED) > FIT, loads  # more copies were asked for than fit
    assert evictions > evictions_before
    assert evictions == sum(loads.values()) - len(resident)  # every load beyond what is resident now evicted one
    assert len(resident & set(DECLARED)) <= FIT

    # Triton's own view, not the gateway's: what the cache unloaded is unloaded there, what it keeps is READY.
    evicted = {model for model, count in loads.items() if count > 0} - resident
    with grpcclient.InferenceServerClient(triton_of_copies.grpc_url) as direct:
        ready_now = ready_in_triton(direct)
        ready_evicted = [model for model in sorted(evicted) if direct.is_model_ready(model)]
    assert evicted
    assert ready_evicted == []
    assert {model for model, _ in ready_now} == resident
    assert len(samples) > 10
    most_ready = max(len({pair for pair in sample if pair[0] in DECLARED}) for sample in samples)
    assert most_ready <= FIT, samples


def test_the_cost_counted_on_a_local_triton_is_its_growth_or_the_larger_declaration(
    cached: RunningGateway, triton_of_copies: LocalTriton, copies: Path
) -> None:
    declared_copy = DECLARED[5]
    with httpx.Client(base_url=f"http://{cached.http_url}", timeout=60, trust_env=False) as http:
        assert http.post(f"/v2/models/{declared_copy}/infer", json=BODY).status_code == 200
        before_mb = triton_mb(triton_of_copies)
        undeclared_answer = http.post(f"/v2/models/{UNDECLARED}/infer", json=BODY)
        grown_mb = triton_mb(triton_of_copies) - before_mb
        assert undeclared_answer.status_code == 200
        declared = http.get(f"/admin/models/{declared_copy}", headers=ADMIN).json()["cache"]
        undeclared = http.get(f"/admin/models/{UNDECLARED}", headers=ADMIN).json()["cache"]
        overview = http.get("/admin/models", headers=ADMIN).json()["cache"]

    assert (declared["resident"], declared["memory_is"], declared["memory_mb"]) == (True, "declared", DECLARED_MB)
    # What Triton's process tree grew by as it loaded the copy (its stub), far above the files' size estimate.
    version_dir = copies / UNDECLARED / undeclared_answer.headers["x-model-version"]
    files_mb = sum(path.stat().st_size for path in version_dir.rglob("*") if path.is_file()) / MIB
    assert (undeclared["resident"], undeclared["memory_is"]) == (True, "measured")
    assert undeclared["memory_mb"] == pytest.approx(grown_mb, abs=10)
    assert files_mb * 10 < undeclared["memory_mb"] < DECLARED_MB
    assert cached.metric("switchyard_model_cache_resident_bytes", model=declared_copy) == DECLARED_MB * MIB
    assert overview["budget_mb"] == BUDGET_MB
    assert overview["used_mb"] <= BUDGET_MB


def test_a_copy_measured_over_the_budget_is_refused_and_not_loaded_again_for_the_next_request(
    install: TritonInstall, copies: Path, tmp_path: Path
) -> None:
    """A Triton and gateway of their own: a budget under what one copy measures, and no other gateway's loads."""
    budget_mb = 40
    with local_triton(copies, tmp_path, install) as server, local_gateway(
        gateway_settings(server.grpc_url, copies, model_cache_mb=budget_mb)
    ) as gateway, httpx.Client(base_url=f"http://{gateway.http_url}", timeout=60, trust_env=False) as http:
        first = http.post(f"/v2/models/{UNDECLARED}/infer", json=BODY)
        second = http.post(f"/v2/models/{UNDECLARED}/infer", json=BODY)
        with grpcclient.InferenceServerClient(server.grpc_url) as direct:
            still_ready = direct.is_model_ready(UNDECLARED)
    loads_in_triton = (tmp_path / "tritonserver.log").read_text().count(f'"loading: {UNDECLARED}:')

    assert first.status_code == 507
    assert re.fullmatch(
        rf"model '{UNDECLARED}' version \d+ needs \d+\.\d MiB \(measured\), more than the whole model cache of "
        rf"{budget_mb} MiB \(SWITCHYARD_MODEL_CACHE_MB\): raise the budget, or serve it elsewhere",
        first.json()["error"],
    ), first.json()
    assert not still_ready  # unloaded again: Triton keeps nothing the budget cannot hold
    assert second.status_code == 507
    # Its measured cost is known now: the next request is refused at once, with the same figure, never by loading the
    # copy into Triton (and holding every other load behind it) only to unload it again.
    assert loads_in_triton == 1, second.json()
    assert second.json() == first.json()
