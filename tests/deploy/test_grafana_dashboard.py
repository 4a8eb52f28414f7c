"""The Grafana dashboard is valid JSON on the provisioned datasource, every PromQL expression in it parses
(``promtool check rules`` on a rules file that records each one) and names only metrics the gateway or Triton
export, and it covers what the README promises: traffic, latency, rejections, batching, versions, canary/shadow,
Triton's queue and compute time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_tools import DASHBOARD, GRAFANA, load_yaml, require_tool
from tests.deploy.promql import (
    TRITON_METRICS,
    as_prometheus_sees_it,
    dashboard_expressions,
    gateway_metrics,
    metric_names,
)

PROMISED = {
    "switchyard_requests_total",
    "switchyard_request_duration_seconds_bucket",
    "switchyard_rejected_total",
    "switchyard_batch_size_bucket",
    "switchyard_active_version",
    "switchyard_version_switches_total",
    "switchyard_canary_weight",
    "switchyard_shadow_requests_total",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_request_success",
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_grafana_dashboard_uses_the_provisioned_datasource_when_loaded(dashboard: dict[str, Any]) -> None:
    datasources = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert [(source["type"], source["uid"], source["url"]) for source in datasources] == [
        ("prometheus", "prometheus", "http://prometheus:9090")
    ]
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "switchyard.yml")["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, panel["title"]
            assert panel["targets"], panel["title"]


def test_grafana_dashboard_names_only_exported_metrics_when_parsed(dashboard: dict[str, Any]) -> None:
    known = gateway_metrics() | TRITON_METRICS
    used: set[str] = set()
    for where, expression in dashboard_expressions(dashboard):
        names = metric_names(expression)
        assert names, f"{where}: no metric in {expression!r}"
        assert names <= known, f"{where}: unknown {sorted(names - known)} in {expression!r}"
        used |= names
    variable = dashboard["templating"]["list"][0]["query"]["query"]
    assert variable == "label_values(switchyard_requests_total, model)"
    assert used >= PROMISED, f"missing panels for {sorted(PROMISED - used)}"


def test_grafana_dashboard_expressions_parse_when_checked_by_promtool(dashboard: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    promtool = require_tool("promtool", "prometheus")
    expressions = list(dashboard_expressions(dashboard))
    rules = [{"record": f"dashboard:expression_{index}", "expr": as_prometheus_sees_it(expression)}
             for index, (_, expression) in enumerate(expressions)]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


def test_grafana_metric_names_reject_an_unknown_metric_when_one_is_used() -> None:
    names = metric_names('histogram_quantile(0.99, sum by (le, model) (rate(made_up_seconds_bucket{model=~"$m"}[5m])))')
    assert names == {"made_up_seconds_bucket"}
    assert metric_names("sum(rate(a_total[1m])) / on (model) group_left sum(b) > bool 0") == {"a_total", "b"}
