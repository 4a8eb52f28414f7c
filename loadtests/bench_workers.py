"""`make bench` (workers): the gateway with 1 and 2 worker processes (``serve --workers N``) on the tiny model, HTTP
JSON and unary gRPC at 32 clients, on the embedded backend and (when `make install` put one under .triton/) in front
of a local Triton. Prints req/s, the gateway's CPU per request (every worker and the supervisor, from /proc) and
the ratios the workers issue targets, and each node's resident memory.

The load comes from `wrk` (HTTP) and `h2load` (gRPC over HTTP/2: a length-prefixed ModelInferRequest): C load
generators, so that on a small machine the clients take little of the CPU the workers share (this bench's Python
clients cost about as much CPU per request as the gateway does, and would cap both runs alike). Without them
(`apt-get install wrk nghttp2-client`) the bench says so and stops.

Each gateway runs as its own session, measured one after the other in alternating order, ``--rounds`` times; each
ratio pairs the runs of one round, its target reads the median.
Usage: ``python loadtests/bench_workers.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from cpu import cpu_seconds, process_group
from options import bench_parser
from processes import free_ports
from tritonclient.grpc import service_pb2
from workload import MODELS, ROOT, ensure_repository, export_all_versions

from services.tritonlocal import LocalTriton, TritonInstall

MODEL = "mlp"
TARGET_SPEEDUP = 1.4
CPU_TOLERANCE = 0.10


def bodies(folder: Path) -> tuple[Path, Path]:
    """The HTTP JSON body and the gRPC message (length-prefixed, as on the wire) of one tiny-model request."""
    name, shape = MODELS[MODEL]
    row = np.random.default_rng(1).standard_normal((1, *shape)).astype(np.float32)
    tensor = {"name": name, "shape": list(row.shape), "datatype": "FP32", "data": row.ravel().tolist()}
    (folder / "body.json").write_text(json.dumps({"inputs": [tensor]}))
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name=name, datatype="FP32", shape=list(row.shape))
    request.raw_input_contents.append(row.tobytes())
    message = request.SerializeToString()
    (folder / "body.grpc").write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
    (folder / "post.lua").write_text(
        'wrk.method = "POST"\nlocal f = io.open("' + str(folder / "body.json") + '", "rb")\n'
        'wrk.body = f:read("*all")\nf:close()\nwrk.headers["Content-Type"] = "application/json"\n'
    )
    return folder / "post.lua", folder / "body.grpc"


@contextlib.contextmanager
def gateway(
    repository: Path, workers: int, logs: Path, *options: str, extra_env: dict[str, str] | None = None
) -> Iterator[tuple[int, int, int]]:
    """A gateway with ``workers`` workers in a session of its own (its CPU is its process group's): its ports and
    its supervisor's (or only process's) pid. ``extra_env``: variables for it alone."""
    http_port, grpc_port = free_ports(2)
    command = [sys.executable, "-c", "from services.cli import main; main()", "serve", *options, "--repository",
               str(repository), "--port", str(http_port), "--grpc-port", str(grpc_port), "--workers", str(workers)]
    env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_WORKERS"} | (extra_env or {})
    env["SWITCHYARD_STATE_PATH"] = str(logs / f"state-{workers}-{http_port}" / "routing.json")
    with (logs / f"gateway-{workers}w-{http_port}.log").open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the {workers}-worker gateway exited; see {logs}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {workers}-worker gateway is not ready; see {logs}")
            time.sleep(0.2)
        yield http_port, grpc_port, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def run_load(protocol: str, port: int, script: Path, message: Path, clients: int, seconds: float) -> float:
    """req/s of one closed-loop run (every answer 2xx, else it fails)."""
    if protocol == "http":
        out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "-s", str(script),
                              f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer"],
                             capture_output=True, text=True, check=True).stdout
        if "Non-2xx" in out or "Socket errors" in out:
            raise RuntimeError(f"wrk saw failed requests:\n{out}")
        return float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    out = subprocess.run(["h2load", "-c", str(clients), "-m", "1", "-D", str(int(seconds)), "-d", str(message),
                          "-H", "content-type: application/grpc", "-H", "te: trailers",
                          f"http://127.0.0.1:{port}/inference.GRPCInferenceService/ModelInfer"],
                         capture_output=True, text=True, check=True).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    if done is None or done[1] != done[2]:
        raise RuntimeError(f"h2load saw failed requests:\n{out}")
    return float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)[1])  # type: ignore[index]


def resident_mib(pid: int) -> float:
    total = 0
    for member in process_group(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{member}/statm").read_text().split()
            total += int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    return total / 2**20


def bench(label: str, repository: Path, logs: Path, args: argparse.Namespace, *options: str) -> list[str]:
    script, message = bodies(logs)
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with gateway(repository, 1, logs, *options) as one, gateway(repository, 2, logs, *options) as two:
        memory = {1: resident_mib(one[2]), 2: resident_mib(two[2])}
        for round_index in range(args.rounds):
            order = [(1, one), (2, two)] if round_index % 2 == 0 else [(2, two), (1, one)]
            for protocol in ("http", "grpc"):
                for workers, (http_port, grpc_port, pid) in order:
                    group = process_group(pid)
                    before = cpu_seconds(group)
                    started = time.monotonic()
                    rate = run_load(protocol, http_port if protocol == "http" else grpc_port, script, message,
                                    args.clients, args.duration)
                    spent = cpu_seconds(group) - before
                    cpu_ms = spent * 1e3 / max(rate * (time.monotonic() - started), 1.0)
                    runs.setdefault((protocol, workers), []).append((rate, cpu_ms))
                    print(f"  {label:<9} {protocol:<4} {workers} worker(s): {rate:8.0f} req/s, "
                          f"CPU {cpu_ms:.3f} ms/req", flush=True)
    lines = [f"{label}: resident memory {memory[1]:.0f} MiB with 1 worker, {memory[2]:.0f} MiB with 2 "
             "(supervisor and workers)"]
    for protocol in ("http", "grpc"):
        pairs = list(zip(runs[(protocol, 2)], runs[(protocol, 1)], strict=True))
        speedup = statistics.median(two[0] / one[0] for two, one in pairs)
        cpu = statistics.median(two[1] / one[1] for two, one in pairs)
        held = speedup >= TARGET_SPEEDUP and abs(cpu - 1) <= CPU_TOLERANCE
        name = "HTTP JSON" if protocol == "http" else "unary gRPC"
        lines.append(
            f"{label} {name} at {args.clients} clients: 2 workers {speedup:.2f}x the req/s of 1 "
            f"({statistics.median(t[0] for t, _ in pairs):.0f} vs {statistics.median(o[0] for _, o in pairs):.0f}), "
            f"{cpu:.2f}x the CPU per request (target >= {TARGET_SPEEDUP}x at {1 - CPU_TOLERANCE:.2f}-"
            f"{1 + CPU_TOLERANCE:.2f}x) {'ok' if held else 'MISSED'}"
        )
    return lines


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[32])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; each ratio reads the median")
    parser.add_argument("--no-triton", action="store_true", help="leave out the Triton backend")
    args = parser.parse_args()
    args.clients = max(args.concurrency)
    args.duration = max(int(args.duration), 3)
    missing = [tool for tool in ("wrk", "h2load") if shutil.which(tool) is None]
    if missing:
        print(f"bench_workers: {' and '.join(missing)} not found (apt-get install wrk nghttp2-client): the workers "
              "bench needs load generators that leave the CPU to the workers; skipped")
        return
    repository = ensure_repository(args.repository.resolve(), "switchyard-bench-workers-", export_all_versions)
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-workers-"))
    print(f"gateway with 1 and 2 workers ({MODEL}, {args.clients} clients; logs in {logs}):", flush=True)
    report = bench("embedded", repository, logs, args)
    if not args.no_triton and TritonInstall.default().present():
        triton = LocalTriton(repository, load=(MODEL,), derived=logs / "derived", log_file=logs / "tritonserver.log")
        with triton:
            os.environ["SWITCHYARD_TRITON_LOCAL_CPU"] = "1"
            report += bench("triton", repository, logs, args, "--backend", "triton", "--triton-url", triton.grpc_url,
                            "--triton-http-url", triton.http_url)
    elif not args.no_triton:
        print("no local Triton under .triton/ (run `make install`): the Triton backend is left out", flush=True)
    print("\nWorkers (targets from this run):")
    for line in report:
        print(f"  {line}")


if __name__ == "__main__":
    main()
