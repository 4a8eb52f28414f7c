"""The compose topology (``docker-compose.yml``) started on loopback from the same files: the local CPU Triton, the
gateway as ``switchyard serve`` with the compose ``gateway`` service's settings, a real redis-server and a real
Prometheus with ``deploy/prometheus/prometheus.yml``, every ``service:port`` rewritten to ``127.0.0.1:<free port>``."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from services.tritonlocal import LocalTriton, free_port
from tests.deploy.deploy_tools import COMPOSE, PROMETHEUS_CONFIG, load_yaml, require_tool
from tests.gateway_process import GatewayProcess, gateway_process
from tests.redis_server import RedisServer, redis_server
from tests.slow_work import slow_work
from tests.tritonlocal.support import require_install

SCRAPE_INTERVAL = "1s"
"""The test's scrape interval (compose's is 5 s): a scrape lands within a second or two of the traffic."""


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = load_yaml(COMPOSE)["services"]
    return services


def env_file(service: dict[str, Any]) -> dict[str, str]:
    """The service's ``env_file`` variables, from each file's committed ``.example`` (the real ones are ignored)."""
    values: dict[str, str] = {}
    for name in service.get("env_file", []):
        for line in (COMPOSE.parent / f"{name}.example").read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
    return values


def rewrite(value: str, addresses: dict[str, str]) -> str:
    """Every ``service:port`` of the compose network (as in ``triton:8001``) to the local address standing for it."""
    return re.sub(r"\b([a-z][a-z0-9-]*:\d+)\b", lambda match: addresses.get(match.group(1), match.group(1)), value)


def gateway_settings(addresses: dict[str, str]) -> dict[str, str]:
    """The compose ``gateway`` environment as ``gateway_process`` settings: hosts and ports rewritten to loopback;
    the listen ports and the repository are left out: ``gateway_process`` puts its own on the command line."""
    environment: dict[str, str] = compose_services()["gateway"]["environment"]
    settings: dict[str, str] = {}
    for key, value in environment.items():
        if not key.startswith("SWITCHYARD_"):  # OTEL_*: the trace pipeline, whose collector this topology leaves out
            continue
        name = key.removeprefix("SWITCHYARD_").lower()
        if name in ("port", "grpc_port", "repository"):
            continue
        settings[name] = "127.0.0.1" if name == "host" else rewrite(str(value), addresses)
    return settings


class PrometheusServer:
    """Debian's ``prometheus`` with the compose command line, a rewritten copy of the config and a tmp TSDB."""

    def __init__(self, folder: Path, addresses: dict[str, str]) -> None:
        self.binary = require_tool("prometheus", "prometheus")
        self.folder = folder
        self.port = free_port()
        self.addresses = addresses
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> Path:
        config = load_yaml(PROMETHEUS_CONFIG)
        config["global"].update(scrape_interval=SCRAPE_INTERVAL, scrape_timeout=SCRAPE_INTERVAL)
        for job in config["scrape_configs"]:
            for group in job["static_configs"]:
                group["targets"] = [rewrite(target, self.addresses) for target in group["targets"]]
        path = self.folder / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        return path

    def command(self) -> list[str]:
        """Compose's flags with the container paths replaced by this test's files."""
        paths = {"--config.file": str(self.config()), "--storage.tsdb.path": str(self.folder / "tsdb")}
        flags = []
        for flag in compose_services()["prometheus"]["command"]:
            name, _, value = flag.partition("=")
            flags.append(f"{name}={paths.get(name, value)}")
        return [self.binary, *flags, f"--web.listen-address=127.0.0.1:{self.port}"]

    def start(self) -> None:
        slow_work("starts prometheus")
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / "prometheus.log"
        with log.open("ab") as output:
            self.process = subprocess.Popen(self.command(), stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not get ready; its log:\n{log.read_text()[-4000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def query(self, expression: str) -> httpx.Response:
        return httpx.get(f"{self.url}/api/v1/query", params={"query": expression}, timeout=10)

    def wait_for(
        self, expression: str, accept: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30.0
    ) -> list[dict[str, Any]]:
        """The query's result vector once ``accept`` takes it (scrapes land every second); fails after the bound."""
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.query(expression)
            answer.raise_for_status()
            result: list[dict[str, Any]] = answer.json()["data"]["result"]
            if accept(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression!r} still gives {result} after {timeout_s} s")
            time.sleep(0.25)

    def metric_names(self) -> set[str]:
        answer = httpx.get(f"{self.url}/api/v1/label/__name__/values", timeout=10)
        answer.raise_for_status()
        return set(answer.json()["data"])


@dataclass
class Topology:
    triton: LocalTriton
    redis: RedisServer
    gateway: GatewayProcess
    prometheus: PrometheusServer
    token: str

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@contextmanager
def compose_topology(repository: Path, work: Path) -> Iterator[Topology]:
    """Everything started in dependency order (as compose's ``depends_on``) and stopped in reverse, even on failure."""
    install = require_install()
    services = compose_services()
    token = env_file(services["gateway"])["SWITCHYARD_ADMIN_TOKEN"]
    with ExitStack() as stack:
        triton = stack.enter_context(
            LocalTriton(repository, derived=work / "derived", install=install, log_file=work / "tritonserver.log")
        )
        redis = stack.enter_context(redis_server(work / "redis"))
        addresses = {
            "triton:8000": triton.http_url,
            "triton:8001": triton.grpc_url,
            "triton:8002": f"127.0.0.1:{triton.ports.metrics}",
            "redis:6379": f"127.0.0.1:{redis.port}",
        }
        # The local CPU Triton serves python-backend twins: README "Local Triton" puts this flag on serve for it.
        gateway = stack.enter_context(gateway_process(
            repository, work, token=token, options=("--triton-local-cpu",), **gateway_settings(addresses)
        ))
        addresses.update({"gateway:8000": gateway.http_url, "gateway:8001": gateway.grpc_url})
        prometheus = PrometheusServer(work / "prometheus", addresses)
        stack.callback(prometheus.stop)
        prometheus.start()
        yield Topology(triton, redis, gateway, prometheus, token)

