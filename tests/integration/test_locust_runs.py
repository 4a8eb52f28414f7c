"""``loadtests/locustfile.py`` run headless by the locust CLI against a gateway in its own process, on free ports
(its gRPC port is not the HTTP port + 1): HTTP (JSON and binary), gRPC and the ops user switching versions under
load, every answer checked, and the SLO gates deciding the exit code and naming why a gate failed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.tritonlocal import free_port
from tests.gateway_process import GatewayProcess, gateway_process
from tests.locust_runs import run_locust

TOKEN = "locust-test-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("locust-gateway")
    for model in ("mlp", "classifier"):
        shutil.copytree(repository / model, work / "repository" / model)
    with gateway_process(work / "repository", work, token=TOKEN) as running:
        yield running


def _answers_by_version(gateway: GatewayProcess) -> dict[tuple[str, str], float]:
    """(protocol, version) → successful mlp answers, from the gateway's own counters."""
    text = httpx.get(f"http://{gateway.http_url}/metrics", timeout=10).text
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "switchyard_requests_total" and labels["model"] == "mlp" and labels["code"] == "200":
                key = (labels["protocol"], labels["version"])
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


@pytest.mark.slow
def test_locust_run_passes_its_gates_when_the_ops_user_switches_versions_under_load(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    # Version 1 serves when the run starts; the ops user activates 2 at ~3 s, rolls back at ~6 s, activates at ~9 s.
    activated = httpx.post(f"http://{gateway.http_url}/admin/models/mlp/versions/1/activate", headers=ADMIN, timeout=60)
    assert activated.status_code == 200, activated.text
    before = _answers_by_version(gateway)

    run = run_locust(
        gateway.http_url,
        None,  # locust asks the gateway for its gRPC port
        tmp_path,
        [
            "--model=mlp",
            "--rows=2",
            "--ops-interval=3",
            "--ops-version=2",
            "--exit-code-on-error=1",
            "--slo-error-ratio=0",
            "--slo-p99-ms=infer-json=2000,infer-binary=2000,grpc-infer=2000",
        ],
        seconds=10,
        users=5,
        token=TOKEN,
    )

    assert run.returncode == 0, run.output[-4000:]
    assert f"gRPC target {gateway.grpc_url}: the port the gateway advertises (grpc_port in GET" in run.output
    assert "SLO gate passed: error ratio 0 " in run.output
    assert "SLO gate failed" not in run.output
    for key in [("POST", "infer-json"), ("POST", "infer-binary"), ("grpc", "grpc-infer")]:
        assert run.stats[key].requests > 50, (key, run.stats)
    assert run.stats[("POST", "activate")].requests >= 1
    assert run.stats[("POST", "rollback")].requests >= 1
    assert [row for row in run.stats.values() if row.failures] == []
    assert (tmp_path / "run.html").stat().st_size > 0

    # Both versions answered both protocols during the run, and every switch the ops user made succeeded.
    after = _answers_by_version(gateway)
    for protocol in ("http", "grpc"):
        for version in ("1", "2"):
            assert after.get((protocol, version), 0) > before.get((protocol, version), 0), (protocol, version, after)
    events = httpx.get(f"http://{gateway.http_url}/admin/models/mlp/events", headers=ADMIN, timeout=10).json()
    switches = [e for e in events["events"] if e["action"] in ("activate", "rollback")][1:]  # after our activate
    assert [e["action"] for e in switches][:2] == ["activate", "rollback"]
    assert {e["result"] for e in switches} == {"ok"}


@pytest.mark.slow
def test_locust_run_exits_nonzero_naming_each_gate_and_its_cause_when_the_bounds_cannot_hold(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    # An impossible p99 for HTTP, and gRPC sent to a port where nothing listens: its gate gets no requests. The
    # classifier, whose answers take milliseconds: locust rounds times under 100 ms to whole milliseconds, so the tiny
    # mlp's p99 on an idle machine can read 0 ms and pass any bound.
    closed = f"127.0.0.1:{free_port()}"
    run = run_locust(
        gateway.http_url,
        closed,
        tmp_path,
        ["--model=classifier", "--ops-interval=0", "--slo-error-ratio=0",
         "--slo-p99-ms=infer-json=0.001,grpc-infer=1000"],
        seconds=4,
        users=3,  # the idle ops user, one HTTP user, one gRPC user
    )

    assert run.returncode == 1, run.output[-4000:]
    assert f"gRPC target {closed}: given by --grpc-target" in run.output
    assert "SLO gate failed: p99 of 'infer-json'" in run.output
    assert "allowed 0.001 ms" in run.output
    assert run.stats[("POST", "infer-json")].failures == 0  # the HTTP answers themselves were right
    cause = "'grpc-metadata' (grpc): UNAVAILABLE: "
    gate = next(line for line in run.output.splitlines() if "SLO gate failed: p99 of 'grpc-infer'" in line)
    assert "no requests recorded — every call failed: " + cause in gate, gate
    assert f"(gRPC target {closed}, given by --grpc-target (GRPC_TARGET); " in gate
    assert "set GRPC_TARGET=HOST:PORT)" in gate
    assert "refused" in gate.lower()
    ratio = next(line for line in run.output.splitlines() if "SLO gate failed: error ratio" in line)
    assert "the first failure: " + cause in ratio, ratio
    assert ("grpc", "grpc-infer") not in run.stats
