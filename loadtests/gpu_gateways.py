"""The GPU check's gateways (``gpu_check.py``, step 4): ``switchyard serve`` once per worker count, started together
and waited for until the model serves on every worker, or stopped with the reason the gateway gives for refusing it.
Runs from the checkout with what a lent GPU machine has: the standard library, and this folder's ``processes``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from processes import free_ports, stop_session

READY_TIMEOUT_S = 240.0
"""Sixteen workers each import torch and open a CUDA context before the node is ready."""
REFUSED_FOR_S = 10.0
"""How long the model may stay unready on a listening gateway before the check takes it for refused."""


@contextmanager
def gateways(
    repository: Path, model: str, worker_counts: Sequence[int], logs: Path, *, cache_mb: float
) -> Iterator[dict[int, int]]:
    """``switchyard serve`` once per worker count, all started at once (a GPU node's workers each take seconds to
    import torch and open a CUDA context: started together, the lent machine's minutes go to measuring), each in a
    process session of its own; yields worker count -> HTTP port once every one of them serves ``model``.
    The 1-worker gateway runs with a model cache of ``cache_mb`` and ``model`` pinned: loaded at its start within
    that budget, or refused naming what it was charged. Stopped, whole sessions, on exit."""
    started: dict[int, tuple[subprocess.Popen[bytes], int, Path]] = {}
    try:
        for workers in worker_counts:
            port = free_ports(1)[0]
            cache = {"SWITCHYARD_MODEL_CACHE_MB": str(cache_mb), "SWITCHYARD_PINNED_MODELS": model}
            gateway = start_gateway(repository, workers, port, logs, cache if workers == 1 else {})
            started[workers] = (gateway, port, logs / f"gateway-{workers}w.log")
        for workers, (proc, port, log) in started.items():
            wait_ready(proc, port, model, workers, log)
        yield {workers: port for workers, (_, port, _) in started.items()}
    finally:
        for proc, _, _ in started.values():
            stop_session(proc)


def start_gateway(
    repository: Path, workers: int, http_port: int, logs: Path, settings: dict[str, str]
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "from services.cli import main; main()", "serve", "--repository",
               str(repository), "--port", str(http_port), "--grpc-port", str(free_ports(1)[0]), "--workers",
               str(workers)]
    env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_WORKERS"}
    env["SWITCHYARD_STATE_PATH"] = str(logs / f"state-{workers}w" / "routing.json")
    env.update(settings)
    with (logs / f"gateway-{workers}w.log").open("w") as out:
        return subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(proc: subprocess.Popen[bytes], port: int, model: str, workers: int, log: Path) -> None:
    """Until ``model`` is ready on every worker. Its ready route alone is not enough: the first worker listens
    before the others have started, so the node's per-worker metrics must name all of them. A worker listens only
    once its models are loaded, so a model that stays unready while it listens was refused: the check stops then
    with the reason (a ``KIND_GPU`` model on a process without a usable GPU, say) rather than at the deadline."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    refused_since: float | None = None
    while True:
        ready, refusal = readiness(port, model, workers)
        if ready:
            return
        now = time.monotonic()
        refused_since = None if refusal is None else refused_since or now
        if proc.poll() is not None:
            raise RuntimeError(f"the {workers}-worker gateway exited with status {proc.returncode} before {model} was "
                               f"ready; its log: {log}\n{_tail(log)}")
        if refused_since is not None and now - refused_since > REFUSED_FOR_S:
            raise RuntimeError(f"the {workers}-worker gateway listens but {model} is not ready: {refusal}")
        if now > deadline:
            raise RuntimeError(f"the {workers}-worker gateway did not serve {model} on all its workers within "
                               f"{READY_TIMEOUT_S:.0f} s; its log: {log}\n{_tail(log)}")
        time.sleep(0.25)


def readiness(port: int, model: str, workers: int) -> tuple[bool, str | None]:
    """Whether ``model`` is ready on all ``workers``, and the reason the gateway gives when it is not."""
    base = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(f"{base}/v2/models/{model}/ready", timeout=2):
            pass
        if workers == 1:
            return True, None
        with urllib.request.urlopen(f"{base}/metrics?workers=each", timeout=5) as answer:
            text = answer.read().decode()
    except urllib.error.HTTPError as refused:  # listening, and the model not ready: the answer says why
        return False, refusal_reason(refused.code, refused.read())
    except OSError:  # not listening yet
        return False, None
    return len(set(re.findall(r'switchyard_active_version\{[^}]*worker="(\d+)"', text))) >= workers, None


def cache_charge_mb(port: int, model: str) -> float | None:
    """What the gateway's model cache charges ``model`` (MiB; None: the gateway has no cache, or not that model)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(rf'switchyard_model_cache_resident_bytes\{{model="{re.escape(model)}"\}} (\S+)', text)
    return float(found.group(1)) / 2**20 if found else None


def refusal_reason(status: int, body: bytes) -> str:
    try:
        answer = json.loads(body)
    except ValueError:
        return f"HTTP {status}: {body[:300]!r}"
    return str(answer.get("error", answer)) if isinstance(answer, dict) else f"HTTP {status}: {answer}"


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
