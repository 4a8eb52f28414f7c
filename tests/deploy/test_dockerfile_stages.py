"""The Dockerfile's targets keep their promises: the gateway ships the base install (the very command the
base-install test runs) on a fresh slim base, as a non-root user, with a readiness HEALTHCHECK; the GPU target
swaps in onnxruntime-gpu; the exporter target installs the ``export`` extra with PyTorch's CPU wheel."""

from __future__ import annotations

import json
import re

from tests.deploy.deploy_tools import COMPOSE, DOCKERIGNORE, load_yaml
from tests.deploy.dockerfile import BUILD_STAGE, SOURCE, base_install_command, parse, pip_installs

TARGETS = {"gateway", "gateway-gpu", "exporter", "loadtest"}
PINNED = re.compile(r"^[\w./-]+:[\w.-]*\d[\w.-]*$")
"""An image with a version-bearing tag (``python:3.11.14-slim-bookworm``, not ``python:3.11-slim`` or no tag)."""


def test_dockerfile_gateway_installs_the_base_install_when_built() -> None:
    assert base_install_command("SOURCE") == ["-m", "pip", "install", "--quiet", "SOURCE"]
    dockerfile = parse()
    # Everything in the gateway's venv comes from the build stage, whose only install is the base one.
    assert pip_installs(dockerfile.stage(BUILD_STAGE)) == [["--quiet", SOURCE]]
    copies = dockerfile.stage("gateway").all("COPY")
    assert copies == [f"--from={BUILD_STAGE} /opt/venv /opt/venv"]


def test_dockerfile_final_stages_start_from_a_fresh_slim_base_when_parsed() -> None:
    dockerfile = parse()
    assert set(dockerfile.stages) >= TARGETS
    assert list(dockerfile.stages)[-1] == "gateway", "a plain `docker build .` must give the gateway"
    for target in ("gateway", "gateway-gpu", "exporter"):
        chain = dockerfile.lineage(target)
        root = chain[-1]
        assert dockerfile.resolved_base(root.name).endswith("-slim-bookworm"), target
        assert BUILD_STAGE not in [stage.name for stage in chain], f"{target} would ship the build stage"
        for stage in chain:
            # No apt-get, compiler or pip run in what ships: only the copied venv.
            assert not stage.all("RUN") or stage.name == "runtime", f"{stage.name} runs {stage.all('RUN')}"
    runtime_runs = " ".join(dockerfile.stage("runtime").all("RUN"))
    assert "apt-get" not in runtime_runs
    assert "pip" not in runtime_runs
    for name in dockerfile.stages:
        base = dockerfile.resolved_base(name)
        assert base in dockerfile.stages or PINNED.match(base), f"{name}: FROM {base} is not pinned"


def test_dockerfile_gateway_runs_as_non_root_with_a_readiness_healthcheck_when_parsed() -> None:
    dockerfile = parse()
    for target in ("gateway", "gateway-gpu", "exporter"):
        users = [user for stage in dockerfile.lineage(target) for user in stage.all("USER")]
        assert users, target
        assert users[0] not in {"root", "0"}, target
    healthchecks = [check for stage in dockerfile.lineage("gateway") for check in stage.all("HEALTHCHECK")]
    assert len(healthchecks) == 1
    assert "/v2/health/ready" in healthchecks[0]
    assert "urllib.request" in healthchecks[0]
    assert "curl" not in healthchecks[0]
    exposed = [port for stage in dockerfile.lineage("gateway") for line in stage.all("EXPOSE") for port in line.split()]
    assert exposed == ["8000", "8001"]
    environment = " ".join(env for stage in dockerfile.lineage("gateway") for env in stage.all("ENV"))
    for setting in ("SWITCHYARD_HOST=0.0.0.0", "SWITCHYARD_REPOSITORY=/models", "SWITCHYARD_PORT=8000"):
        assert setting in environment


def test_dockerfile_gpu_target_replaces_onnxruntime_with_the_gpu_build_when_parsed() -> None:
    dockerfile = parse()
    assert dockerfile.stage("gateway-gpu").all("COPY") == ["--from=build-gpu /opt/venv /opt/venv"]
    runs = " && ".join(dockerfile.stage("build-gpu").all("RUN"))
    assert f"{SOURCE}[gpu]" in runs
    assert "pip uninstall --quiet -y onnxruntime onnxruntime-gpu" in runs
    assert runs.index("uninstall") < runs.rindex("onnxruntime-gpu[")


def test_dockerfile_exporter_target_installs_the_export_extra_when_parsed() -> None:
    dockerfile = parse()
    assert dockerfile.stage("exporter").all("COPY") == ["--from=build-export /opt/venv /opt/venv"]
    (install,) = pip_installs(dockerfile.stage("build-export"))
    assert f"{SOURCE}[export]" in install
    assert "torch==2.13.0+cpu" in install
    assert install[install.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    (command,) = dockerfile.stage("exporter").all("CMD")
    assert json.loads(command) == ["python", "-m", "examples.export_examples", "--repository", "/models"]


def test_dockerfile_targets_are_the_ones_compose_builds_when_parsed() -> None:
    services = load_yaml(COMPOSE)["services"]
    built = {service["build"]["target"] for service in services.values() if "build" in service}
    assert built == {"gateway", "exporter", "loadtest"}
    assert built <= set(parse().stages)


def test_dockerfile_context_allows_only_what_the_build_copies_when_parsed() -> None:
    lines = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*", ".dockerignore should allow-list the build context"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {source for line in parse().stage(BUILD_STAGE).all("COPY") for source in line.split()[:-1]}
    assert allowed == copied == {"pyproject.toml", "README.md", "services", "exporter", "examples"}
