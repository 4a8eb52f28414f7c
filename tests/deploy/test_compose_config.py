"""docker-compose.yml (and the GPU override) pass ``docker-compose config`` for the default stack, the GPU variant and
each profile, from a clean checkout (the git-ignored env files made from their committed examples), and keep the
promises the README makes: only the gateway and Grafana published, explicit model control, health-gated startup,
pinned images."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_tools import COMPOSE, COMPOSE_GPU, ENV_EXAMPLES, load_yaml, require_tool
from tests.import_probe import ROOT

VARIANTS = {
    "default": ["-f", "docker-compose.yml"],
    "gpu": ["-f", "docker-compose.yml", "-f", "docker-compose.gpu.yml"],
    "export": ["-f", "docker-compose.yml", "--profile", "export"],
    "loadtest": ["-f", "docker-compose.yml", "--profile", "loadtest"],
}
PUBLISHED = {"gateway": {"8000:8000", "8001:8001"}, "grafana": {"3000:3000"}}
LOCUST_PARSE = """
import json, sys
sys.path.insert(0, "loadtests")
import locustfile  # registers the load test's own options, as `locust -f` does
from locust.argument_parser import parse_options
options = parse_options(args=json.loads(sys.argv[1]))
print(json.dumps({"host": options.host, "grpc_target": options.grpc_target, "headless": options.headless}))
"""
"""Locust's own parser in a process of its own (importing locust monkey-patches the process with gevent)."""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compose files with the env files a user makes from the examples: compose refuses a missing env_file."""
    root = tmp_path_factory.mktemp("compose")
    for path in (COMPOSE, COMPOSE_GPU):
        shutil.copy2(path, root / path.name)
    for example, target in ENV_EXAMPLES.items():
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(example, root / target)
    return root


def compose_config(project: Path, arguments: list[str]) -> dict[str, Any]:
    binary = require_tool("docker-compose", "docker-compose")
    done = subprocess.run([binary, *arguments, "config"], cwd=project, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    raw: dict[str, Any] = load_yaml(COMPOSE)["services"]
    return raw


@pytest.mark.parametrize("variant", VARIANTS)
def test_compose_config_is_valid_when_checked_quietly(project: Path, variant: str) -> None:
    binary = require_tool("docker-compose", "docker-compose")
    done = subprocess.run([binary, *VARIANTS[variant], "config", "-q"], cwd=project, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_compose_config_fails_when_the_gateway_env_file_is_missing(tmp_path: Path) -> None:
    binary = require_tool("docker-compose", "docker-compose")
    shutil.copy2(COMPOSE, tmp_path / COMPOSE.name)
    done = subprocess.run([binary, "config", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "gateway.env" in done.stderr


def test_compose_triton_gets_the_gpu_only_when_the_gpu_file_is_added(project: Path) -> None:
    default = compose_config(project, VARIANTS["default"])["services"]["triton"]
    gpu = compose_config(project, VARIANTS["gpu"])["services"]["triton"]
    assert "deploy" not in default
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert [(device["driver"], device["capabilities"]) for device in devices] == [("nvidia", ["gpu"])]
    assert {key: value for key, value in gpu.items() if key != "deploy"} == default


def test_compose_publishes_only_gateway_and_grafana_ports_when_parsed(services: dict[str, Any]) -> None:
    published = {name: set(service["ports"]) for name, service in services.items() if "ports" in service}
    assert published == PUBLISHED
    assert services["triton"]["expose"] == ["8000", "8001", "8002"]
    assert "network_mode" not in services["triton"]


def test_compose_triton_uses_explicit_model_control_when_parsed(services: dict[str, Any]) -> None:
    command = services["triton"]["command"]
    assert command[0] == "tritonserver"
    assert "--model-repository=/models" in command
    assert "--model-control-mode=explicit" in command
    # The gateway loads what it serves through the repository API; Triton loading models itself would race it.
    assert not [argument for argument in command if argument.startswith("--load-model")]
    assert "/v2/health/live" in " ".join(services["triton"]["healthcheck"]["test"])


def test_compose_gateway_waits_for_healthy_triton_and_redis_when_parsed(services: dict[str, Any]) -> None:
    gateway = services["gateway"]
    assert gateway["depends_on"] == {"triton": {"condition": "service_healthy"},
                                     "redis": {"condition": "service_healthy"}}
    assert gateway["environment"]["SWITCHYARD_BACKEND"] == "triton"
    assert gateway["environment"]["SWITCHYARD_TRITON_URL"] == "triton:8001"
    assert gateway["environment"]["SWITCHYARD_TRITON_HTTP_URL"] == "triton:8000"
    assert gateway["environment"]["SWITCHYARD_REDIS_URL"] == "redis://redis:6379/0"
    assert gateway["environment"]["SWITCHYARD_HOST"] == "0.0.0.0"
    assert gateway["environment"]["SWITCHYARD_REPOSITORY"] == "/models"
    assert gateway["env_file"] == ["deploy/gateway.env"]
    assert "SWITCHYARD_ADMIN_TOKEN" not in gateway["environment"]
    assert "/v2/health/ready" in " ".join(gateway["healthcheck"]["test"])
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_compose_images_are_pinned_when_parsed(services: dict[str, Any]) -> None:
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository, f"{name}: {image} has no tag"
        assert tag, f"{name}: {image} has no tag"
        assert "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image}"
    assert services["triton"]["image"].startswith("nvcr.io/nvidia/tritonserver:")
    assert services["triton"]["image"].endswith("-py3")


def test_compose_one_shot_services_sit_in_their_profiles_when_parsed(services: dict[str, Any]) -> None:
    profiled = {name: service["profiles"] for name, service in services.items() if "profiles" in service}
    assert profiled == {"exporter": ["export"], "locust": ["loadtest"]}
    assert services["exporter"]["build"]["target"] == "exporter"
    assert "./model_repository:/models" in services["exporter"]["volumes"]
    locust = services["locust"]
    assert "loadtests/locustfile.py" in locust["command"]
    assert "--headless" in locust["command"]
    assert "--host=http://gateway:8000" in locust["command"]
    assert locust["depends_on"] == {"gateway": {"condition": "service_healthy"}}


def test_compose_services_writing_into_the_checkout_run_as_the_callers_uid_when_configured(project: Path) -> None:
    # A container writing into a bind-mounted folder of the checkout (the exporter's models, locust's reports) as its
    # image's own uid cannot create files there when another uid owns the checkout: both take the caller's.
    binary = require_tool("docker-compose", "docker-compose")
    arguments = ["-f", "docker-compose.yml", "--profile", "export", "--profile", "loadtest", "config"]
    env = {**os.environ, "SWITCHYARD_UID": "4321", "SWITCHYARD_GID": "4322"}
    done = subprocess.run([binary, *arguments], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    writers = set()
    for name, service in yaml.safe_load(done.stdout)["services"].items():
        for volume in service.get("volumes", []):  # compose v1 resolves each to SOURCE:TARGET:MODE
            source, mode = volume.split(":", 1)[0], volume.rsplit(":", 1)[-1]
            if source.startswith("/") and mode == "rw":  # a host path, not a named volume
                writers.add(name)
                assert service.get("user") == "4321:4322", f"{name} writes into {source} as its image's uid"
    assert writers == {"exporter", "locust"}


def test_compose_env_files_are_ignored_by_git_when_created() -> None:
    for target in ENV_EXAMPLES.values():
        done = subprocess.run(["git", "check-ignore", "-q", target], cwd=COMPOSE.parent, timeout=30)
        assert done.returncode == 0, f"{target} would be committed"
    for example in ENV_EXAMPLES:
        done = subprocess.run(["git", "check-ignore", "-q", str(example)], cwd=COMPOSE.parent, timeout=30)
        assert done.returncode == 1, f"{example} is ignored"


def test_compose_locust_command_parses_when_read_by_the_locustfile(services: dict[str, Any]) -> None:
    command = services["locust"]["command"]
    done = subprocess.run([sys.executable, "-c", LOCUST_PARSE, json.dumps(command)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout.splitlines()[-1])
    assert parsed == {"host": "http://gateway:8000", "grpc_target": "gateway:8001", "headless": True}
