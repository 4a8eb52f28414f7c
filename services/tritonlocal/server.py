"""``LocalTriton``: one tritonserver process from the nvidia-pytriton wheel, serving a derived repository.

Started in ``--model-control-mode=explicit`` on 127.0.0.1; ports stay fixed across restarts so clients
(and the gateway) can reconnect to the same addresses.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from services.exits import describe_exit
from services.modelrepo.config import select_versions
from services.tritonlocal.control import run_control
from services.tritonlocal.derive import DerivedRepository, build_derived_repository
from services.tritonlocal.errors import TritonLocalError, TritonStartError
from services.tritonlocal.follow import Follower
from services.tritonlocal.install import TritonInstall
from services.tritonlocal.processes import (
    HOST,
    check_ports_free,
    digest,
    free_port,
    free_ports,
    live,
    reap_group,
    shared_memory_state,
    stub_regions,
)
from services.tritonlocal.tracing import TritonTracing

__all__ = ["LocalTriton", "TritonGrpcTls", "TritonPorts", "free_port"]

_POLL_S = 0.1
_WATCHDOG = Path(__file__).with_name("watchdog.py")
_LOG_TAIL_LINES = 30


# Loopback traffic must never go through an http_proxy from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class TritonGrpcTls:
    """TLS on Triton's gRPC endpoint (Triton's HTTP front end has none): its certificate and key, and, for mutual
    TLS, the CA that signs its clients' certificates. The HTTP endpoint (readiness) stays plain; so does
    ``load``/``unload``'s own control client, which therefore cannot be used while this is set."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def flags(self) -> list[str]:
        flags = ["--grpc-use-ssl=true", f"--grpc-server-cert={self.cert_file}", f"--grpc-server-key={self.key_file}"]
        if self.client_ca_file is not None:
            flags += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={self.client_ca_file}"]
        return flags


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int


class LocalTriton:
    """Start/stop a local CPU Triton; also a context manager.

    ``repository`` is an exporter repository; it is served through a derived copy (``derived``, by default
    under the install's ``repositories/``). Ports given as 0 are picked once, at construction. ``load``
    names models loaded at startup with their config's version policy; the others wait for ``load()``.
    ``log_file`` receives the server's output (``None``: inherit this process's stdout/stderr).
    ``tracing`` turns Triton's OpenTelemetry traces on (``None``: off; see ``tracing.py``); ``grpc_tls`` serves gRPC
    over TLS (``TritonGrpcTls``).
    ``stop()`` sends SIGTERM, which Triton honours after draining for up to ``exit_timeout_s``; SIGKILL
    follows if it is still running after ``stop_timeout_s``.
    """

    def __init__(
        self,
        repository: Path,
        *,
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        load: Sequence[str] = (),
        derived: Path | None = None,
        install: TritonInstall | None = None,
        log_file: Path | None = None,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
        exit_timeout_s: int = 3,
        tracing: TritonTracing | None = None,
        grpc_tls: TritonGrpcTls | None = None,
    ) -> None:
        self.install = install or TritonInstall.default()
        self.source = Path(repository).resolve()
        self.derived_root = derived or self.install.home / "repositories" / f"{self.source.name}-{digest(self.source)}"
        picked = iter(free_ports(3))
        self.ports = TritonPorts(http_port or next(picked), grpc_port or next(picked), metrics_port or next(picked))
        self.startup_models = tuple(load)
        self.log_file = log_file
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.exit_timeout_s = exit_timeout_s
        self.tracing = tracing
        self.grpc_tls = grpc_tls
        self._process: subprocess.Popen[bytes] | None = None
        self._ending = False  # stop() or kill() ended it: an exit then is no crash
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._repository: DerivedRepository | None = None
        self._follower: Follower | None = None

    # -- addresses -----------------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        """``host:port``, the form tritonclient expects (no scheme)."""
        return f"{HOST}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.ports.metrics}/metrics"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def repository(self) -> DerivedRepository:
        """The derived repository; built on first use, rebuilt by ``build()`` and every ``start()``."""
        return self._repository or self.build()

    # -- lifecycle -----------------------------------------------------------------------------------------
    def build(self) -> DerivedRepository:
        self._repository = build_derived_repository(self.source, self.derived_root)
        return self._repository

    def command(self) -> list[str]:
        install = self.install
        return [
            str(install.binary),
            f"--model-repository={self.derived_root}",
            f"--backend-directory={install.backends}",
            f"--cache-directory={install.caches}",
            "--model-control-mode=explicit",
            *(f"--load-model={name}" for name in self.startup_models),
            f"--http-address={HOST}",
            f"--http-port={self.ports.http}",
            f"--grpc-address={HOST}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={HOST}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-gpu-metrics=false",
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            # The configs are complete; auto-complete would only slow loading down.
            "--disable-auto-complete-config",
            # After SIGTERM, Triton waits this long for open HTTP connections (idle keep-alive ones included)
            # and in-flight requests; its default of 30 s would make every stop slow.
            f"--exit-timeout-secs={self.exit_timeout_s}",
            *(self.tracing.flags() if self.tracing is not None else ()),
            *(self.grpc_tls.flags() if self.grpc_tls is not None else ()),
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The stub finds its interpreter as python3 on PATH and ignores PYTHONPATH/PYTHONHOME.
        env["PATH"] = f"{self.install.stubenv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        lib = str(self.install.base_lib())
        env["LD_LIBRARY_PATH"] = f"{lib}{os.pathsep}{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else lib
        for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(name, None)
        return env

    def start(self) -> None:
        """Check the install, (re)build the derived repository, start tritonserver and wait until it is ready."""
        if self.running:
            raise TritonLocalError(f"tritonserver is already running (pid {self.pid})")
        self.install.check()
        if self._process is not None:  # killed from outside (a crash test): its python stubs may linger
            reap_group(self._process)
            self._end_watchdog()
        check_ports_free({"HTTP": self.ports.http, "gRPC": self.ports.grpc, "metrics": self.ports.metrics})
        self.build()
        log: IO[bytes] | None = self.log_file.open("ab") if self.log_file is not None else None
        self._ending = False
        try:
            self._process = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # Ctrl-C reaches the launcher, which then stops the server cleanly
            )
            # atexit cannot run when this process is SIGKILLed: the watchdog stops the orphan then.
            self._watchdog = subprocess.Popen(
                [sys.executable, str(_WATCHDOG), str(os.getpid()), str(self._process.pid)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()
        live.add(self._process)
        try:
            self.wait_ready(self.ready_timeout_s)
        except BaseException:
            self.kill()
            raise

    def follow(self, interval_s: float) -> None:
        """Rebuild the derived repository every ``interval_s`` until ``stop()``: versions and models exported into
        the source repository while the server runs become loadable (a production Triton reads the repository
        itself; this build serves a derived copy)."""
        if self._follower is None:
            self._follower = Follower(self.build, interval_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                code = self._process.returncode if self._process is not None else None
                ended = describe_exit(code) if code is not None else "an unknown status"
                raise TritonStartError(f"tritonserver exited with {ended} before it was ready{self._log_tail()}")
            if self.ready():
                return
            time.sleep(_POLL_S)
        raise TritonStartError(f"tritonserver was not ready after {timeout_s:.0f} s{self._log_tail()}")

    def ready(self) -> bool:
        """``/v2/health/ready``: the server is up and every loaded model is ready."""
        try:
            with _DIRECT.open(f"http://{self.http_url}/v2/health/ready", timeout=1.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``stop_timeout_s``; returns the exit code (``None`` if never started)."""
        if self._follower is not None:
            self._follower.stop()
            self._follower = None
        process = self._process
        if process is None:
            return None
        self._ending = True
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(self.stop_timeout_s)
        reap_group(process)
        live.discard(process)
        self._end_watchdog()
        return process.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would; then the python stubs it leaves behind are killed too."""
        process = self._process
        self._ending = True
        regions: list[str] = []
        if process is not None and process.poll() is None:
            regions = stub_regions(process.pid)  # read while the stubs run: they may exit before the reap
            process.kill()
            process.wait(self.stop_timeout_s)
        if process is not None:
            reap_group(process, regions)
            live.discard(process)
        self._end_watchdog()

    def _end_watchdog(self) -> None:
        """The watchdog ends by itself once the server has exited; collect it (or end it if it hangs)."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        try:
            watchdog.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> LocalTriton:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        crash = self.crash_report()
        self.stop()
        if crash is None:
            return
        # The server died under whatever used it: say so with its own last words, or what failed next (a client's
        # "connection refused") is all anyone sees.
        if exc is not None:
            exc.add_note(crash)
        else:
            raise TritonLocalError(crash)

    def crash_report(self) -> str | None:
        """How the server ended if it exited by itself (a crash, the OOM killer, a kill from outside) rather than
        through ``stop()`` or ``kill()``: its exit code or signal, how full /dev/shm is (where its python-backend stubs
        keep their regions) and the last lines of its log; ``None`` while it runs or when it was stopped."""
        process = self._process
        if process is None or self._ending or process.poll() is None:
            return None
        ended = describe_exit(process.returncode)
        return f"tritonserver (pid {process.pid}) exited by itself: {ended}; {shared_memory_state()}{self._log_tail()}"

    # -- model control (services.modelrepo.control, over gRPC) --------------------------------------------
    def load(self, model: str, versions: Sequence[int] | None = None, timeout_s: float = 60.0) -> None:
        """Load ``model`` with its complete derived config, pinned to ``versions`` (default: what its version
        policy selects); return once they are ready and the versions it drops have finished unloading."""
        self.build()  # pick up versions exported since the server started
        derived = self.repository.models.get(model)
        if derived is None:
            raise TritonLocalError(f"no model '{model}' in {self.source}")
        chosen = select_versions(derived.config, derived.versions) if versions is None else tuple(versions)
        run_control(self.grpc_url, lambda control: control.load(model, derived.config, chosen, timeout_s=timeout_s))

    def unload(self, model: str, timeout_s: float = 30.0) -> None:
        """Unload ``model`` and return once no version is still unloading."""
        run_control(self.grpc_url, lambda control: control.unload(model, timeout_s=timeout_s))

    def model_states(self, model: str) -> dict[int, str]:
        """Version → state (``READY``, ``UNAVAILABLE``, ...) from the repository index."""
        return run_control(self.grpc_url, lambda control: control.index(10.0)).get(model, {})

    def _log_tail(self) -> str:
        if self.log_file is None or not self.log_file.is_file():
            return ""
        lines = self.log_file.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
        return f"; last lines of {self.log_file}:\n" + "\n".join(lines)
