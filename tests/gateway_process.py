"""``switchyard serve`` in a child process on free ports: the topology users run (clients and gateway do not share
an interpreter), and one a test can SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.tritonlocal import free_ports
from tests.slow_work import slow_work


@dataclass
class GatewayProcess:
    command: list[str]
    env: dict[str, str]
    log: Path
    http_port: int = 0
    grpc_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    ready_tls: tuple[str, str, str] | None = None
    """(CA file, client certificate, client key) when the gateway serves HTTPS with client certificates."""

    def __post_init__(self) -> None:
        if not self.http_port or not self.grpc_port:  # picked together: one after another they may come out equal
            self.http_port, self.grpc_port = free_ports(2)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout_s: float = 120.0) -> None:
        """Start it and wait until ``/v2/health/ready`` answers 200 (same ports on every start)."""
        slow_work("starts a gateway process")
        command = [*self.command, "--port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(command, env=self.env, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        scheme: str = "http"
        verify: bool | ssl.SSLContext = True
        if self.ready_tls is not None:
            ca_file, cert_file, key_file = self.ready_tls
            context = ssl.create_default_context(cafile=ca_file)
            context.load_cert_chain(cert_file, key_file)
            scheme, verify = "https", context
        try:
            self._wait_ready(scheme, verify, deadline)
        except BaseException:
            self.kill()  # whatever went wrong (a bad client setting, an interrupt), no gateway is left running
            raise

    def _wait_ready(self, scheme: str, verify: bool | ssl.SSLContext, deadline: float) -> None:
        assert self.process is not None
        while True:
            try:
                answer = httpx.get(f"{scheme}://{self.http_url}/v2/health/ready", timeout=2.0, verify=verify)
                if answer.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not get ready; its log:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node loss would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def gateway_process(
    repository: Path, work: Path, *, token: str, options: tuple[str, ...] = (),
    ready_tls: tuple[str, str, str] | None = None, **settings: str
) -> Iterator[GatewayProcess]:
    """``options`` go to ``switchyard serve``; ``settings`` become ``SWITCHYARD_<NAME>`` variables; ``ready_tls``:
    (CA, client certificate, client key) for a gateway serving HTTPS with client certificates."""
    switchyard = Path(sys.executable).with_name("switchyard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.update(
        SWITCHYARD_ADMIN_TOKEN=token,
        SWITCHYARD_STATE_PATH=str(work / "state" / "routing.json"),
        SWITCHYARD_REPOSITORY_POLL_S="0",
    )
    env.update({f"SWITCHYARD_{name.upper()}": value for name, value in settings.items()})
    gateway = GatewayProcess([str(switchyard), "serve", "--repository", str(repository), *options], env,
                             work / "gateway.log", ready_tls=ready_tls)
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


@contextmanager
def gateway_on_copy(
    repository: Path, work: Path, *, token: str, models: tuple[str, ...] = ("classifier", "mlp")
) -> Iterator[GatewayProcess]:
    """A gateway serving a copy of ``models`` from ``repository`` (a test may then change the copy freely)."""
    for model in models:
        shutil.copytree(repository / model, work / "repository" / model)
    with gateway_process(work / "repository", work, token=token) as gateway:
        yield gateway
