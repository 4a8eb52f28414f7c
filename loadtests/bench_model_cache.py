"""`make bench` (model cache): more models than fit under ``SWITCHYARD_MODEL_CACHE_MB``, driven with Zipf traffic.

40 copies of the example mlp (``--with-classifier``: every fourth a copy of the classifier), each renamed in its
config.pbtxt and declaring its memory (``switchyard.memory_mb``), under a budget that holds 8 of them; 8 closed-loop
clients, each with its own seeded random, pick each request's model from a Zipf distribution (s = 1.1, the first
copy the most asked for) for ``--duration`` seconds. ``switchyard serve`` runs as a child process on the embedded
backend, and in front of a local Triton (explicit model control) when `make install` put one under .triton/.

Before that, on each backend, the cold load of each example (mlp, classifier) to its first answer: a fresh cache,
one request timed, then the model unloaded as idle (``SWITCHYARD_MODEL_IDLE_UNLOAD_S``) before the next, a few
times. The largest cost the gateway counted for those loads (on the embedded backend measured: the process's resident
memory before and after) is what each copy declares on that backend, unless ``--model-mb`` says.

Prints requests sent and failed, the hit ratio (``switchyard_model_cache_requests_total``), the miss latency
(``switchyard_model_cache_load_seconds``), evictions by reason and the age at eviction, and on the embedded backend
the gateway's resident memory sampled every 100 ms against (idle + budget) x 1.2. Exits 1 when a request failed,
a gateway died or the memory bound did not hold. Usage: ``python loadtests/bench_model_cache.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from clients import binary_body, exchange, http_request
from gateway_readings import SAMPLE_S, MemorySampler, by_label, histogram, scrape
from options import bench_parser
from processes import free_ports, gateway_command, process
from workload import MODELS, ensure_repository, export_all_versions

from services.tritonlocal import LocalTriton, TritonInstall

FIT = 8
"""How many copies the budget holds."""
ZIPF_S = 1.1
ADMIN_TOKEN = secrets.token_urlsafe(24)
MIB = 2**20
MEMORY_SLACK = 1.2
"""The gateway's resident memory in traffic stays within (idle + budget) x this."""
IDLE_UNLOAD_S = 0.5
"""The cold-load gateway unloads a model this long after its last request, so that the next request loads it."""


@dataclass
class Gateway:
    url: str
    pid: int
    log: Path
    proc: subprocess.Popen[bytes]


@dataclass
class Traffic:
    sent: int = 0
    failures: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    per_model: Counter[str] = field(default_factory=Counter)


@contextlib.contextmanager
def serve(repository: Path, logs: Path, label: str, settings: dict[str, str], *options: str) -> Iterator[Gateway]:
    """``switchyard serve`` on free ports, with its own state path and only the ``SWITCHYARD_*`` variables given
    here (the caller's would change what is measured), in a session of its own; stopped on exit."""
    http_port, grpc_port = free_ports(2)
    env = {name: value for name, value in os.environ.items() if not name.startswith("SWITCHYARD_")}
    env["SWITCHYARD_ADMIN_TOKEN"] = ADMIN_TOKEN
    env["SWITCHYARD_STATE_PATH"] = str(logs / f"state-{label}" / "routing.json")
    env |= settings
    log = logs / f"gateway-{label}.log"
    url = f"http://127.0.0.1:{http_port}"
    command = gateway_command(repository, http_port, grpc_port, *options)
    with process(command, f"{url}/v2/health/ready", log, env=env, own_session=True) as proc:
        yield Gateway(url, proc.pid, log, proc)


def admin(url: str, path: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/admin{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        found: dict[str, Any] = json.loads(answer.read())
        return found


def cache_of(url: str, model: str) -> dict[str, Any]:
    found = admin(url, f"/models/{model}")["cache"]
    assert isinstance(found, dict), f"/admin/models/{model} has no cache object: is SWITCHYARD_MODEL_CACHE_MB set?"
    return found


# -- the repositories --------------------------------------------------------------------------------------------
def copy_model(source: Path, target: Path, name: str, declared_mb: float | None) -> None:
    """``source`` (a model folder) as model ``name``, renamed in its config and declaring ``declared_mb``."""
    shutil.copytree(source, target / name)
    config = target / name / "config.pbtxt"
    text = config.read_text().replace(f'name: "{source.name}"', f'name: "{name}"', 1)
    if declared_mb is not None:
        text += f'parameters {{ key: "switchyard.memory_mb" value {{ string_value: "{declared_mb:g}" }} }}\n'
    config.write_text(text)


def mix(source: Path, target: Path, count: int, declared_mb: float, with_classifier: bool) -> dict[str, str]:
    """``count`` copies, most asked for first: each copy's name and the example it copies."""
    copies = {}
    for rank in range(count):
        example = "classifier" if with_classifier and rank % 4 == 3 else "mlp"
        name = f"{example}{rank:02d}"
        copy_model(source / example, target, name, declared_mb)
        copies[name] = example
    return copies


def request_bytes(url: str, model: str, example: str) -> bytes:
    """One binary-tensor inference request of ``model`` (a copy of ``example``), built once and replayed."""
    name, shape = MODELS[example]
    row = np.random.default_rng(1).standard_normal((1, *shape)).astype(np.float32)
    body, headers = binary_body(name, row)
    return http_request(f"{url}/v2/models/{model}/infer", body, headers)


# -- the Zipf traffic --------------------------------------------------------------------------------------------
async def zipf_traffic(url: str, copies: dict[str, str], args: argparse.Namespace) -> Traffic:
    """``args.clients`` closed-loop clients for ``args.duration`` s; a failed request is kept (model, time, answer)
    and the client goes on (on a new connection when the old one broke)."""
    names = list(copies)
    weights = [1 / rank**ZIPF_S for rank in range(1, len(names) + 1)]
    requests = {name: request_bytes(url, name, example) for name, example in copies.items()}
    host, port = url.split("//")[1].split(":")
    traffic = Traffic()
    started = time.perf_counter()
    stop = started + args.duration

    async def client(index: int) -> None:
        pick = random.Random(args.seed * 1000 + index)
        streams = await asyncio.open_connection(host, int(port))
        while (began := time.perf_counter()) < stop:
            model = pick.choices(names, weights)[0]
            traffic.sent += 1
            traffic.per_model[model] += 1
            try:
                status, answer = await asyncio.wait_for(exchange(streams, requests[model]), args.request_timeout)
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                traffic.failures.append(f"{model} at {began - started:.1f} s: no answer ({exc!r})")
                streams[1].close()
                try:
                    streams = await asyncio.open_connection(host, int(port))
                except OSError:
                    return  # the gateway is gone: its exit is reported
                continue
            if status != 200:
                traffic.failures.append(f"{model} at {began - started:.1f} s: HTTP {status} {answer[:300]!r}")
            traffic.latencies_ms.append((time.perf_counter() - began) * 1e3)
        streams[1].close()

    await asyncio.gather(*(client(index) for index in range(args.clients)))
    traffic.seconds = time.perf_counter() - started
    return traffic


# -- the two measurements ----------------------------------------------------------------------------------------
@dataclass
class ColdLoads:
    lines: list[str]
    largest_mb: float
    """The largest cost the gateway counted for a load: on the embedded backend the first load in the process, which
    the one-time allocations of the runtime are counted to."""


def cold_loads(repository: Path, logs: Path, label: str, options: tuple[str, ...], settings: dict[str, str],
               repeats: int) -> ColdLoads:
    """Each example's load to its first answer: a fresh cache, one request, the model unloaded as idle, again."""
    settings = settings | {"SWITCHYARD_MODEL_CACHE_MB": "4096", "SWITCHYARD_MODEL_MIN_RESIDENCY_S": "0",
                           "SWITCHYARD_MODEL_IDLE_UNLOAD_S": str(IDLE_UNLOAD_S)}
    first_answer: dict[str, list[float]] = {example: [] for example in MODELS}
    counted: dict[str, list[tuple[float, str]]] = {example: [] for example in MODELS}
    with serve(repository, logs, f"cold-{label}", settings, *options) as gateway:
        requests = {example: request_bytes(gateway.url, example, example) for example in MODELS}
        host, port = gateway.url.split("//")[1].split(":")

        async def once(request: bytes) -> tuple[int, bytes, float]:
            streams = await asyncio.open_connection(host, int(port))
            began = time.perf_counter()
            try:
                status, answer = await asyncio.wait_for(exchange(streams, request), 120)
            finally:
                streams[1].close()
            return status, answer, (time.perf_counter() - began) * 1e3

        for _ in range(repeats):
            for example in MODELS:
                deadline = time.monotonic() + 30
                while cache_of(gateway.url, example)["resident"]:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"bench_model_cache: {example} was not unloaded as idle in 30 s; see "
                                         f"{gateway.log}")
                    time.sleep(0.05)
                status, answer, elapsed_ms = uvloop.run(once(requests[example]))
                if status != 200:
                    raise SystemExit(f"bench_model_cache: {label} cold load of {example}: HTTP {status} "
                                     f"{answer[:300]!r}; see {gateway.log}")
                first_answer[example].append(elapsed_ms)
                shown = cache_of(gateway.url, example)
                counted[example].append((float(shown["memory_mb"]), str(shown["memory_is"])))
        metrics = scrape(gateway.url)
    lines = []
    for example in MODELS:
        times, loads = first_answer[example], histogram(metrics, "switchyard_model_cache_load_seconds", example)
        costs = ", ".join(f"{mb:g} {how}" for mb, how in counted[example])
        lines.append(f"{label} {example}: cold load to first answer {times[0]:.0f} ms on a fresh cache, then "
                     f"{' / '.join(f'{t:.0f}' for t in times[1:])} ms (median of all {statistics.median(times):.0f} ms;"
                     f" the gateway's load and warm-up: {loads.count:.0f} loads, mean {loads.mean() * 1e3:.0f} ms); "
                     f"memory counted per load (MiB): {costs}")
    return ColdLoads(lines, max(mb for example in MODELS for mb, _ in counted[example]))


def zipf_run(copies: dict[str, str], repository: Path, logs: Path, label: str, options: tuple[str, ...],
             settings: dict[str, str], args: argparse.Namespace, budget_mb: float) -> tuple[list[str], list[str]]:
    """The Zipf traffic through one gateway: its report's lines, and what failed (empty when all held)."""
    embedded = "--backend" not in options
    with serve(repository, logs, f"zipf-{label}", settings, *options) as gateway:
        sampler = MemorySampler(gateway.pid)
        idle = statistics.median(_sample_idle(sampler))
        with sampler:
            traffic = uvloop.run(zipf_traffic(gateway.url, copies, args))
        exited = gateway.proc.poll()
        metrics = scrape(gateway.url) if exited is None else {}
        overview = admin(gateway.url, "/models") if exited is None else {}
    problems = [f"{label}: request {failure}" for failure in traffic.failures[:10]]
    if len(traffic.failures) > 10:
        problems.append(f"{label}: ... and {len(traffic.failures) - 10} more failed requests")
    if exited is not None:
        problems.append(f"{label}: the gateway exited with code {exited} during the run; see {gateway.log}")
        return [f"{label}: the gateway died; {traffic.sent} requests sent, {len(traffic.failures)} failed"], problems
    requests = by_label(metrics, "switchyard_model_cache_requests", "result")
    asked = sum(requests.values())
    evictions = by_label(metrics, "switchyard_model_cache_evictions", "reason")
    loads = histogram(metrics, "switchyard_model_cache_load_seconds")
    ages = histogram(metrics, "switchyard_model_cache_age_at_eviction_seconds")
    latencies = sorted(traffic.latencies_ms) or [math.nan]
    lines = [
        f"{label}: {traffic.sent} requests sent in {traffic.seconds:.1f} s ({traffic.sent / traffic.seconds:.0f} "
        f"req/s), {len(traffic.failures)} failed; latency p50 {latencies[len(latencies) // 2]:.1f} ms, p99 "
        f"{latencies[int(len(latencies) * 0.99)]:.0f} ms, max {latencies[-1]:.0f} ms; the most asked-for copy "
        f"{traffic.per_model.most_common(1)[0][1] if traffic.per_model else 0} requests, "
        f"{len(traffic.per_model)} of {len(copies)} copies asked for",
        f"{label}: hit ratio {requests['hit'] / max(asked, 1):.3f} ({requests['hit']:.0f} hit, {requests['miss']:.0f} "
        f"miss, {requests['miss_waiting']:.0f} miss_waiting; the gateway counted {asked:.0f} of the "
        f"{traffic.sent} requests)",
        f"{label}: miss latency (load and warm-up) {loads.count:.0f} loads, mean {loads.mean() * 1e3:.0f} ms, p50 "
        f"{loads.quantile(0.5)}, p95 {loads.quantile(0.95)}",
        f"{label}: evictions {', '.join(f'{n:.0f} {reason}' for reason, n in sorted(evictions.items())) or 'none'}; "
        f"age at eviction mean {ages.mean():.1f} s ({ages.spread()})",
    ]
    lines.append(f"{label}: {_counted(overview)}")
    if embedded:
        peak, bound = max(sampler.samples, default=math.nan), (idle + budget_mb) * MEMORY_SLACK
        held = peak <= bound
        lines.append(f"{label}: gateway resident memory idle {idle:.0f} MiB, max {peak:.0f} MiB in traffic "
                     f"({len(sampler.samples)} samples, every {SAMPLE_S * 1e3:.0f} ms); bound (idle {idle:.0f} + "
                     f"budget {budget_mb:g}) x {MEMORY_SLACK} = {bound:.0f} MiB: {'held' if held else 'EXCEEDED'}")
        if not held:
            problems.append(f"{label}: resident memory {peak:.0f} MiB over the bound of {bound:.0f} MiB")
    if traffic.failures:
        problems += [f"{label}: gateway log: {line}" for line in _log_errors(gateway.log)]
    return lines, problems


def _sample_idle(sampler: MemorySampler) -> list[float]:
    """The idle gateway's resident memory, a second of samples before any traffic."""
    found = []
    for _ in range(10):
        found.append(sampler.resident_mib())
        time.sleep(SAMPLE_S)
    return found


def _counted(overview: dict[str, Any]) -> str:
    """What the gateway counted per copy (its last load's cost and how it came by it) and in all."""
    costs: dict[str, list[float]] = {}
    for model in overview.get("models", []):
        cache = model["cache"]
        if cache["memory_is"]:
            costs.setdefault(cache["memory_is"], []).append(cache["memory_mb"])
    described = "; ".join(f"{how} for {len(mbs)} copies, {min(mbs):g}-{max(mbs):g} MiB" for how, mbs in costs.items())
    total = overview.get("cache") or {}
    return (f"memory the gateway counted per copy at its last load: {described or 'none loaded'}; in use at the "
            f"end {total.get('used_mb')} of {total.get('budget_mb')} MiB")


def _log_errors(log: Path) -> list[str]:
    lines = [line.rstrip() for line in log.read_text(errors="replace").splitlines()]
    return [line for line in lines if " ERROR " in line or " WARNING " in line or "Traceback" in line][:15]


@contextlib.contextmanager
def backend(name: str, repository: Path, logs: Path) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    """The gateway's options and variables for backend ``name``; for Triton, a local one serving ``repository``
    in explicit mode (nothing loaded: the gateway's cache loads what it needs), running until the exit."""
    if name == "embedded":
        yield (), {}
        return
    with LocalTriton(repository, load=(), derived=logs / f"derived-{repository.name}",
                     log_file=logs / f"tritonserver-{repository.name}.log") as triton:
        # SWITCHYARD_TRITON_LOCAL_CPU: serve the python-backend twins this CPU Triton runs (bench_triton.py does too)
        yield (("--backend", "triton", "--triton-url", triton.grpc_url, "--triton-http-url", triton.http_url),
               {"SWITCHYARD_TRITON_LOCAL_CPU": "1"})


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[8])
    parser.set_defaults(duration=60.0)
    parser.add_argument("--models", type=int, default=40, help="copies in the mix (the budget holds 8)")
    parser.add_argument("--model-mb", type=float,
                        help="what each copy declares (switchyard.memory_mb); default: the largest cost the gateway "
                             "counted for a cold load of an example on that backend, rounded up")
    parser.add_argument("--with-classifier", action="store_true", help="every fourth copy is the classifier's")
    parser.add_argument("--min-residency-s", type=float,
                        help="SWITCHYARD_MODEL_MIN_RESIDENCY_S (default: the gateway's own default)")
    parser.add_argument("--cold-repeats", type=int, default=4, help="cold loads of each example per backend")
    parser.add_argument("--request-timeout", type=float, default=90.0, help="seconds a request may take")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-triton", action="store_true", help="leave out the Triton backend")
    args = parser.parse_args()
    args.clients = max(args.concurrency)
    source = ensure_repository(args.repository.resolve(), "switchyard-bench-model-cache-", export_all_versions)
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-model-cache-"))
    backends = ["embedded"]
    if not args.no_triton and TritonInstall.default().present():
        backends.append("triton")
    elif not args.no_triton:
        print("no local Triton under .triton/ (run `make install`): the Triton backend is left out", flush=True)
    print(f"model cache: cold loads, then {args.models} copies under a budget that holds {FIT}, {args.clients} "
          f"clients, Zipf s = {ZIPF_S}, {args.duration:g} s, on {' and '.join(backends)} (logs in {logs})", flush=True)
    cold_repository = logs / "cold"
    for example in MODELS:
        copy_model(source / example, cold_repository, example, None)
    report: list[str] = []
    problems: list[str] = []
    for name in backends:
        with backend(name, cold_repository, logs) as (options, env):
            cold = cold_loads(cold_repository, logs, name, options, env, args.cold_repeats)
        # Each backend's copies declare the largest load its gateway counted (measured on the embedded backend and
        # on a local Triton), not the mlp's own: the first load in a process is counted the runtime's one-time
        # allocations too (~10-17 MiB on the embedded backend), and a copy declaring less would get such a load
        # refused as larger than the whole budget.
        declared = args.model_mb or max(1.0, float(math.ceil(cold.largest_mb)))
        budget = FIT * declared + declared / 2  # 8 fit, a ninth does not
        zipf_repository = logs / f"zipf-{name}"
        copies = mix(source, zipf_repository, args.models, declared, args.with_classifier)
        settings = {"SWITCHYARD_MODEL_CACHE_MB": f"{budget:g}"}
        if args.min_residency_s is not None:
            settings["SWITCHYARD_MODEL_MIN_RESIDENCY_S"] = f"{args.min_residency_s:g}"
        residency = f"{args.min_residency_s:g} s" if args.min_residency_s is not None else "the gateway's default"
        lines = [*cold.lines, f"{name}: each copy declares {declared:g} MiB ("
                 f"{'--model-mb' if args.model_mb else 'the largest load counted above, rounded up'}); budget "
                 f"{budget:g} MiB; min residency {residency}"]
        _print(lines)
        report += lines
        with backend(name, zipf_repository, logs) as (options, env):
            lines, found = zipf_run(copies, zipf_repository, logs, name, options, settings | env, args, budget)
        _print(lines)
        report += lines
        problems += found
    print("\nModel cache (figures from this run):")
    _print(report)
    if problems:
        print("\nFAILED:")
        _print(problems)
        sys.exit(1)


def _print(lines: list[str]) -> None:
    for line in lines:
        print(f"  {line}", flush=True)


if __name__ == "__main__":
    main()
