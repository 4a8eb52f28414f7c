"""deploy/prometheus/alerts.yml: valid rules (``promtool check rules``) that fire and stay quiet as their unit tests
say (``promtool test rules`` on alerts.test.yml, a firing and a quiet case for every alert), that say what happened
and what to do first, that name only series a gateway node exports, and that the compose Prometheus loads from where
docker-compose.yml mounts them and evaluates against what it scrapes."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import httpx
import pytest
import yaml

from services.tritonlocal import free_port
from tests.deploy.compose_topology import SCRAPE_INTERVAL, PrometheusServer, compose_services
from tests.deploy.deploy_tools import (
    COMPOSE,
    PROMETHEUS_ALERT_TESTS,
    PROMETHEUS_ALERTS,
    PROMETHEUS_CONFIG,
    load_yaml,
    require_tool,
)
from tests.deploy.promql import PROMETHEUS_SERIES, exposition_names, metric_names
from tests.gateway_process import gateway_process
from tests.redis_server import redis_server

SEVERITIES = {"critical", "warning"}
TOKEN = "alerts-test-admin-token-0123456789"


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(PROMETHEUS_ALERTS)["groups"] for rule in group["rules"]]


def test_prometheus_alerts_pass_promtool_check_rules_when_checked() -> None:
    promtool = require_tool("promtool", "prometheus")
    done = subprocess.run([promtool, "check", "rules", str(PROMETHEUS_ALERTS)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_prometheus_alerts_fire_and_stay_quiet_as_their_unit_tests_expect_when_run_by_promtool() -> None:
    promtool = require_tool("promtool", "prometheus")
    done = subprocess.run([promtool, "test", "rules", str(PROMETHEUS_ALERT_TESTS)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_prometheus_alert_unit_tests_have_a_firing_and_a_quiet_case_for_every_alert_when_parsed() -> None:
    tests = load_yaml(PROMETHEUS_ALERT_TESTS)
    assert [PROMETHEUS_ALERT_TESTS.parent / name for name in tests["rule_files"]] == [PROMETHEUS_ALERTS]
    alerts = {rule["alert"] for rule in alert_rules()}
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in tests["tests"]:
        for case in test["alert_rule_test"]:
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert firing | quiet <= alerts, f"tests of alerts the rules lack: {sorted((firing | quiet) - alerts)}"
    assert alerts - firing == set(), "alerts never shown to fire"
    assert alerts - quiet == set(), "alerts never shown to stay quiet"


def test_prometheus_alerts_carry_a_severity_a_summary_and_a_first_step_when_parsed() -> None:
    rules = alert_rules()
    assert 6 <= len(rules) <= 10
    assert len({rule["alert"] for rule in rules}) == len(rules)
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert set(rule["annotations"]) == {"summary", "description"}, name
        # Every alert names what it is about from its labels, and tells the operator where to start.
        assert "{{ $labels." in rule["annotations"]["summary"], name
        assert "First:" in rule["annotations"]["description"], name


def compose_prometheus_files() -> tuple[PurePosixPath, dict[PurePosixPath, Path]]:
    """The compose Prometheus's ``--config.file`` and the checkout's files mounted into it, by path in the container."""
    prometheus = compose_services()["prometheus"]
    config_file = next(flag.partition("=")[2] for flag in prometheus["command"] if flag.startswith("--config.file="))
    mounted = {}
    for volume in prometheus["volumes"]:
        source, _, target = volume.partition(":")
        if source.startswith("."):  # not a named volume
            mounted[PurePosixPath(target.partition(":")[0])] = (COMPOSE.parent / source).resolve()
    return PurePosixPath(config_file), mounted


def test_prometheus_config_loads_the_alerts_from_where_compose_mounts_them_when_checked() -> None:
    promtool = require_tool("promtool", "prometheus")
    rule_files: list[str] = load_yaml(PROMETHEUS_CONFIG)["rule_files"]
    assert [(PROMETHEUS_CONFIG.parent / name).resolve() for name in rule_files] == [PROMETHEUS_ALERTS]
    # In the container a relative rule file is read from the config file's folder: compose must put it there.
    config_file, mounted = compose_prometheus_files()
    assert mounted[config_file] == PROMETHEUS_CONFIG
    for name in rule_files:
        assert mounted.get(config_file.parent / name) == PROMETHEUS_ALERTS, (name, mounted)
    # promtool follows rule_files and checks each file it names (a path that matches no file fails here).
    done = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


@pytest.fixture(scope="module")
def node_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Series names a gateway node's /metrics declares with every feature an alert watches on: several workers
    (worker restarts), Redis (audit events) and the model cache; the TLS and request series are always declared."""
    work = tmp_path_factory.mktemp("alerts_node")
    (work / "repository").mkdir()
    with redis_server(work / "redis") as redis, gateway_process(
        work / "repository", work, token=TOKEN, options=("--workers", "2"), redis_url=redis.url, model_cache_mb="64"
    ) as gateway:
        yield exposition_names(httpx.get(f"http://{gateway.http_url}/metrics", timeout=10).text)


@pytest.mark.slow
def test_prometheus_alerts_name_only_series_a_gateway_node_exports_when_scraped(node_metrics: set[str]) -> None:
    known = node_metrics | PROMETHEUS_SERIES
    for rule in alert_rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no metric in {rule['expr']!r}"
        assert names <= known, f"{rule['alert']}: {sorted(names - known)} not exported by a gateway node"


def mount_like_compose(folder: Path) -> None:
    """Copy the files compose mounts beside prometheus.yml into ``folder``, where PrometheusServer writes its copy of
    prometheus.yml: the rule files reach Prometheus only where the compose volumes put them."""
    config_file, mounted = compose_prometheus_files()
    folder.mkdir(parents=True, exist_ok=True)
    for container, source in mounted.items():
        if container.parent == config_file.parent and container != config_file:
            (folder / container.name).write_bytes(source.read_bytes())


class QuickPrometheus(PrometheusServer):
    """The compose Prometheus evaluating its rules every second (prometheus.yml: 15 s), as it scrapes here."""

    def config(self) -> Path:
        path = super().config()
        config = load_yaml(path)
        config["global"]["evaluation_interval"] = SCRAPE_INTERVAL
        path.write_text(yaml.safe_dump(config))
        return path


def loaded_rules(prometheus: PrometheusServer) -> dict[str, dict[str, Any]]:
    """Every alerting rule Prometheus holds, by name."""
    answer = httpx.get(f"{prometheus.url}/api/v1/rules", params={"type": "alert"}, timeout=10)
    answer.raise_for_status()
    return {rule["name"]: rule for group in answer.json()["data"]["groups"] for rule in group["rules"]}


def rules_once_evaluated(prometheus: PrometheusServer, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """Every alerting rule by name, once each has been evaluated and the gateway's target seen down (its state
    pending: the rule's ``for`` has not passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rules = loaded_rules(prometheus)
        # A rule not evaluated yet reports Go's zero time.
        evaluated = not any(rule["lastEvaluation"].startswith("0001-") for rule in rules.values())
        if evaluated and rules["SwitchyardGatewayDown"]["state"] == "pending":
            return rules
        if time.monotonic() > deadline:
            raise AssertionError(f"rules not all evaluated, or the gateway not seen down, after {timeout_s} s: {rules}")
        time.sleep(0.5)


@pytest.mark.slow
def test_prometheus_loads_and_evaluates_the_alerts_when_started_as_compose_runs_it(tmp_path: Path) -> None:
    folder = tmp_path / "prometheus"
    mount_like_compose(folder)
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there: the gateway's and Triton's targets are down
    prometheus = QuickPrometheus(folder, {"gateway:8000": closed, "triton:8002": closed})
    try:
        prometheus.start()
        # Loaded with the configuration, before Prometheus is ready; a rule file it cannot find is no error to it.
        assert set(loaded_rules(prometheus)) == {rule["alert"] for rule in alert_rules()}
        rules = rules_once_evaluated(prometheus)
    finally:
        prometheus.stop()
    assert {name: rule["health"] for name, rule in rules.items() if rule["health"] != "ok"} == {}
    down = rules["SwitchyardGatewayDown"]["alerts"]
    assert [alert["labels"]["job"] for alert in down] == ["switchyard-gateway"]
