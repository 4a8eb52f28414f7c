"""The compose stack end to end on loopback (tests/deploy/compose_topology.py): traffic and a version swap through
the gateway in front of Triton land in the Prometheus that ``deploy/prometheus/prometheus.yml`` configures, every
PromQL expression of the Grafana dashboard runs there and names only exported metrics, and a short locust run with
a version activation in the middle has no failures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.compose_topology import Topology, compose_topology
from tests.deploy.deploy_tools import DASHBOARD
from tests.deploy.promql import SUFFIXES, as_prometheus_sees_it, dashboard_expressions, metric_names
from tests.locust_runs import run_locust
from tests.shared_exports import copy_examples

pytestmark = pytest.mark.slow

REQUESTS = 150
"""Per version: 300 mlp requests in all, a few seconds on loopback."""


@pytest.fixture(scope="module")
def topology(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    # What the compose ``exporter`` service writes (`make models`): the session's export, copied.
    repository = copy_examples(example_repository, tmp_path_factory.mktemp("compose_repository"))
    with compose_topology(repository, tmp_path_factory.mktemp("compose")) as running:
        yield running


def _activate(topology: Topology, version: int) -> None:
    url = f"http://{topology.gateway.http_url}/admin/models/mlp/versions/{version}/activate"
    answer = httpx.post(url, headers=topology.admin, timeout=60)
    assert answer.status_code == 200, answer.text


def _infer(client: httpx.Client, rows: int) -> None:
    features = np.random.default_rng(rows).standard_normal((rows, 32), dtype=np.float32)
    tensor = {"name": "features", "shape": [rows, 32], "datatype": "FP32", "data": features.ravel().tolist()}
    body = {"inputs": [tensor]}
    answer = client.post("/v2/models/mlp/infer", json=body)
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def swapped(topology: Topology) -> Topology:
    """Traffic on mlp version 1, an activation of version 2 through the admin API, traffic on version 2."""
    with httpx.Client(base_url=f"http://{topology.gateway.http_url}", timeout=30) as client:
        _activate(topology, 1)
        for index in range(REQUESTS):
            _infer(client, 1 + index % 4)
        _activate(topology, 2)
        for index in range(REQUESTS):
            _infer(client, 1 + index % 4)
    return topology


def _value(result: list[dict[str, Any]]) -> float:
    return sum(float(series["value"][1]) for series in result)


def test_prometheus_scrapes_gateway_and_triton_when_traffic_and_a_swap_went_through_the_compose_topology(
    swapped: Topology,
) -> None:
    prometheus = swapped.prometheus
    up = prometheus.wait_for("up", lambda result: len(result) == 2 and _value(result) == 2)
    assert {series["metric"]["job"] for series in up} == {"switchyard-gateway", "triton"}

    # Bounded polls: a scrape lands every second; the last one must have seen all the traffic and the swap.
    requests = prometheus.wait_for(
        'sum(switchyard_requests_total{model="mlp",code="200"})', lambda result: _value(result) >= 2 * REQUESTS
    )
    assert _value(requests) >= 2 * REQUESTS
    active = prometheus.wait_for('switchyard_active_version{model="mlp"}', lambda result: _value(result) == 2)
    assert [series["metric"]["job"] for series in active] == ["switchyard-gateway"]
    # Triton counts rows; every version-2 request had at least one.
    served = prometheus.wait_for(
        'sum(nv_inference_count{model="mlp",version="2"})', lambda result: _value(result) >= REQUESTS
    )
    assert _value(served) >= REQUESTS
    by_version = prometheus.wait_for(
        'sum by (version) (switchyard_requests_total{model="mlp",code="200"})',
        lambda result: {series["metric"].get("version") for series in result} >= {"1", "2"},
    )
    assert all(_value([series]) >= REQUESTS for series in by_version)

    # The swap went through the compose Redis (SWITCHYARD_REDIS_URL): the shared routing record names version 2.
    with redis.Redis.from_url(swapped.redis.url) as client:
        record = client.hget("switchyard:routing", "mlp")
    assert record is not None
    assert json.loads(record)["stable"] == 2


def _exported(topology: Topology) -> set[str]:
    """Series names the gateway's /metrics and Triton's metrics port declare (a labelled family with no child yet
    has HELP/TYPE lines but no sample, so Prometheus alone would not know it)."""
    names: set[str] = set()
    for url in (f"http://{topology.gateway.http_url}/metrics", topology.triton.metrics_url):
        for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
            names.update(sample.name for sample in family.samples)
    return names


def test_grafana_dashboard_queries_run_and_name_exported_metrics_when_sent_to_the_compose_prometheus(
    swapped: Topology,
) -> None:
    prometheus = swapped.prometheus
    prometheus.wait_for("switchyard_active_version", lambda result: len(result) > 0)
    exported = _exported(swapped) | prometheus.metric_names()
    expressions = list(dashboard_expressions(json.loads(DASHBOARD.read_text())))
    assert expressions

    for where, expression in expressions:
        answer = prometheus.query(as_prometheus_sees_it(expression))
        assert answer.status_code == 200, (where, expression, answer.text)
        assert answer.json()["status"] == "success", (where, expression, answer.text)
        assert metric_names(expression) <= exported, (where, sorted(metric_names(expression) - exported))


def test_locust_run_has_no_failures_when_mlp_is_activated_mid_run_through_the_compose_gateway(
    topology: Topology, tmp_path: Path
) -> None:
    _activate(topology, 1)
    # The ops user activates version 2 at ~3 s and rolls back at ~6 s while HTTP and gRPC users infer.
    run = run_locust(
        topology.gateway.http_url,
        topology.gateway.grpc_url,
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
        seconds=8,
        users=4,
        token=topology.token,
    )

    assert run.returncode == 0, run.output[-4000:]
    assert run.stats[("POST", "activate")].requests >= 1, run.stats
    assert [row for row in run.stats.values() if row.failures] == []
    assert sum(row.requests for row in run.stats.values()) > 100, run.stats
