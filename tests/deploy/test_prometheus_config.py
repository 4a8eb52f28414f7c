"""deploy/prometheus/prometheus.yml passes ``promtool check config`` and scrapes the gateway's /metrics and Triton's
metrics port at the compose services' names."""

from __future__ import annotations

import subprocess
from typing import Any

from tests.deploy.deploy_tools import PROMETHEUS_CONFIG, load_yaml, require_tool


def test_prometheus_config_is_valid_when_checked_by_promtool() -> None:
    promtool = require_tool("promtool", "prometheus")
    done = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_prometheus_config_scrapes_gateway_and_triton_when_parsed() -> None:
    jobs: list[dict[str, Any]] = load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]
    targets = {
        (job.get("metrics_path", "/metrics"), target)
        for job in jobs
        for static in job["static_configs"]
        for target in static["targets"]
    }
    assert targets == {("/metrics", "gateway:8000"), ("/metrics", "triton:8002")}
