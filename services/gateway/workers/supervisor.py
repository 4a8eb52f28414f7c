"""``switchyard serve --workers N``: the supervisor. It reserves the node's ports, starts worker 0 (which runs the
version actions and persists the routing) and, once it is ready, the others; restarts a worker that dies (with a
backoff, counted and logged) while the others keep serving, and kills one whose event loop stopped turning
(``liveness.py``) to restart it the same way; and on SIGTERM or SIGINT stops them all (each drains:
its answers in flight are delivered), then exits.

The supervisor serves nothing itself and loads no model: a crash in a worker never takes it down."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

import httpx

from services.exits import describe_exit
from services.gateway.server import PortUnavailable, check_ports, listeners
from services.gateway.settings import Settings
from services.gateway.shaping.node_share import NodeShare
from services.gateway.workers.entry import start_worker
from services.gateway.workers.liveness import Liveness
from services.gateway.workers.place import WorkerPlace
from services.gateway.workers.sockets import reuseport_socket
from services.gateway.workers.spec import ConfigTransform, WorkerSpec

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STEADY_S = 60.0
"""A worker that served this long before dying is restarted after ``FIRST_BACKOFF_S`` again, not a longer wait."""
STARTUP_TIMEOUT_S = 900.0
"""How long a worker may take to load and warm its models before the node gives up starting."""
STOP_TIMEOUT_S = 60.0
"""How long the workers may take to drain and exit after SIGTERM before they are killed."""


class StartFailed(Exception):
    """A worker exited while the node was starting (its log says why); the node does not start."""


@dataclass
class _Worker:
    index: int
    process: BaseProcess
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0
    backoff_s: float = FIRST_BACKOFF_S
    due: float | None = None
    """When a dead worker is started again."""
    hung_s: float | None = None
    """How long it had been silent when the watchdog killed it (its death is then logged as that)."""


MEMORY_FOLDER = Path("/dev/shm")


def node_folder(memory: Path = MEMORY_FOLDER) -> Path:
    """The node's private folder (mode 0700: only this user's processes), in memory when the system has a tmpfs for
    it: every request writes the shared figures' file, and on a disk-backed file those writes wait for the page's
    writeback now and then (measured here: half the node's throughput lost to I/O wait)."""
    if memory.is_dir() and os.access(memory, os.W_OK | os.X_OK):
        return Path(tempfile.mkdtemp(prefix="switchyard-node-", dir=memory))
    log.warning("no writable %s: the node's shared figures live in %s, on disk, which slows every request",
                memory, tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix="switchyard-node-"))


def worker_count(asked: int, cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """``asked``, or for 0 the cores this process may use: its CPU affinity, within a container's CPU limit
    (cgroup v2 ``cpu.max``, rounded up) when one is set."""
    if asked > 0:
        return asked
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup.read_text().split()
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    return max(1, min(cores, math.ceil(int(quota) / int(period))))


class Supervisor:
    def __init__(self, settings: Settings, config_transform: ConfigTransform | None = None) -> None:
        self._count = worker_count(settings.workers)
        # The reservations share their ports with SO_REUSEPORT, so they would share them with another node of this
        # user too: the check (without it) finds a port anyone holds, before the node's folder is made.
        check_ports(settings)
        self._reservations = _reserve(settings)
        http_port = self._reservations[0].getsockname()[1]
        grpc_port = self._reservations[1].getsockname()[1] if len(self._reservations) > 1 else None
        self.http_port, self.grpc_port = http_port, grpc_port
        self._folder = node_folder()
        self._settings = settings.model_copy(update={"port": http_port, "grpc_port": grpc_port,
                                                     "workers": self._count})
        self._transform = config_transform
        place = WorkerPlace(0, self._count, self._folder)
        self._share = NodeShare.create(place.share_path, self._count)
        self._liveness = Liveness.create(place.liveness_path, self._count)
        self._hang_timeout_s = settings.worker_hang_timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._workers: dict[int, _Worker] = {}
        self._stopping = False

    @property
    def folder(self) -> Path:
        return self._folder

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit status (a worker's, when the node could not start)."""
        previous = {sig: signal.signal(sig, self._stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            try:
                self._start_all()
            except StartFailed as exc:
                log.error("%s", exc)
                return 2
            log.info("node ready: %d workers on http %s:%d%s; the node's folder %s", self._count,
                     self._settings.host, self.http_port,
                     f", grpc {self._settings.host}:{self.grpc_port}" if self.grpc_port is not None else "",
                     self._folder)
            while not self._stopping:
                self._tend()
                time.sleep(0.2)
            return 0
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()
            log.info("node stopped: %d workers, %d restarts", self._count,
                     sum(w.restarts for w in self._workers.values()))

    def close(self) -> None:
        """Lets the node's ports and folder go (its workers stopped)."""
        for sock in self._reservations:
            sock.close()
        self._share.close()
        self._liveness.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _start_all(self) -> None:
        # Worker 0 first: it persists the routing at startup, which the others then read.
        self._spawn(0)
        self._wait_ready([0])
        for index in range(1, self._count):
            self._spawn(index)
        self._wait_ready(list(range(1, self._count)))

    def _spawn(self, index: int) -> None:
        place = WorkerPlace(index, self._count, self._folder)
        known = self._workers.get(index)
        spec = WorkerSpec(self._settings, place, self._transform, known.restarts if known is not None else 0)
        self._liveness.reset(index)  # what its previous process last wrote says nothing of this one
        process = self._context.Process(target=start_worker, args=(spec,), name=f"switchyard-worker-{index}")
        process.start()
        log.info("worker %d started (pid %s)", index, process.pid)
        if known is None:
            self._workers[index] = _Worker(index, process)
        else:
            known.process, known.started, known.due, known.hung_s = process, time.monotonic(), None, None

    def _wait_ready(self, indices: list[int]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        waiting = set(indices)
        while waiting:
            if self._stopping:
                raise StartFailed("stopped while the workers were starting")
            for index in list(waiting):
                worker = self._workers[index]
                if not worker.process.is_alive():
                    raise StartFailed(f"worker {index} exited with {_how(worker.process)} while starting; "
                                      "its log above says why")
                if self._ready(index):
                    waiting.discard(index)
            if time.monotonic() > deadline:
                raise StartFailed(f"worker(s) {sorted(waiting)} not ready after {STARTUP_TIMEOUT_S:g} s")
            time.sleep(0.1)

    def _ready(self, index: int) -> bool:
        path = self._folder / f"worker-{index}.sock"
        if not path.exists():
            return False
        try:
            # Plain HTTP over a Unix socket: no TLS, so no CA bundle to load (~20 ms of CPU a poll otherwise).
            transport = httpx.HTTPTransport(uds=str(path), verify=False)
            with httpx.Client(transport=transport, base_url="http://worker") as client:
                return client.get("/peer/ready", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _tend(self) -> None:
        """Restart dead workers, each after its backoff; kill hung ones (restarted the same way)."""
        now = time.monotonic()
        for worker in self._workers.values():
            if worker.due is None and worker.hung_s is None and worker.process.is_alive():
                self._watch(worker, now)
            if worker.due is None and not worker.process.is_alive():
                if now - worker.started >= STEADY_S:  # it served a while: a fresh failure, not a crash loop
                    worker.backoff_s = FIRST_BACKOFF_S
                delay = worker.backoff_s
                worker.backoff_s = min(worker.backoff_s * 2, MAX_BACKOFF_S)  # the next death within a minute waits more
                worker.due = now + delay
                worker.restarts += 1
                # Its concurrency slots are freed now, not at its restart: the backoff (up to 30 s) would hold them
                # from the node's other workers meanwhile. It is dead, so it never gives them back itself.
                self._share.reset_worker(worker.index)
                how = _how(worker.process) if worker.hung_s is None else \
                    f"{_how(worker.process)} from the watchdog, its event loop silent for {worker.hung_s:.0f} s"
                log.error("worker %d (pid %s) died with %s; restarting it in %.0f s (restart %d)", worker.index,
                          worker.process.pid, how, delay, worker.restarts)
            elif worker.due is not None and now >= worker.due:
                self._spawn(worker.index)

    def _watch(self, worker: _Worker, now: float) -> None:
        """Kill a worker whose event loop has stopped turning: it holds its share of the node's new connections and
        answers none (SIGKILL: a hung loop would not run a SIGTERM's drain)."""
        if not self._hang_timeout_s or worker.process.pid is None:
            return
        silent = self._liveness.silent_s(worker.index)
        if silent is None:  # not beating yet: loading its models, which may take as long as a start may
            if now - worker.started <= STARTUP_TIMEOUT_S:
                return
            why = f"was not serving {STARTUP_TIMEOUT_S:.0f} s after it started"
        elif silent > self._hang_timeout_s:
            why = f"gave no sign of life for {silent:.0f} s (SWITCHYARD_WORKER_HANG_TIMEOUT_S={self._hang_timeout_s:g})"
        else:
            return
        worker.hung_s = silent if silent is not None else now - worker.started
        log.error("worker %d (pid %s) %s: killing it", worker.index, worker.process.pid, why)
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join(5)

    def _stop_all(self) -> None:
        alive = [w.process for w in self._workers.values() if w.process.is_alive()]
        for process in alive:
            if process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in alive:
            process.join(max(deadline - time.monotonic(), 0.1))
            if process.is_alive():
                log.error("worker pid %s did not stop within %.0f s; killing it", process.pid, STOP_TIMEOUT_S)
                process.kill()
                process.join(5)


def _reserve(settings: Settings) -> list[socket.socket]:
    """The node's HTTP port, then its gRPC port unless gRPC is off; ``PortUnavailable`` naming the one that failed."""
    reserved: list[socket.socket] = []
    for listener in listeners(settings):
        try:
            reserved.append(reuseport_socket(settings.host, listener[2]))
        except OSError as exc:  # taken since check_ports looked
            for sock in reserved:
                sock.close()
            raise PortUnavailable(listener, settings.host, exc) from None
    return reserved


def _how(process: BaseProcess) -> str:
    code = process.exitcode
    if code is None:
        return "no exit status yet"
    return describe_exit(code)


def supervise(settings: Settings, config_transform: ConfigTransform | None = None) -> int:
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s supervisor %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per readiness poll otherwise
    return Supervisor(settings, config_transform).run()



