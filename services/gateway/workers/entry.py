"""The function the supervisor hands ``multiprocessing`` to start a worker: it imports the worker (the whole
gateway) only in the worker's own interpreter, so that the supervisor, which never serves, stays small."""

from __future__ import annotations

from services.gateway.workers.spec import WorkerSpec


def start_worker(spec: WorkerSpec) -> None:
    from services.gateway.workers.worker import run_worker

    run_worker(spec)
