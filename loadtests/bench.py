"""`make bench`: in-process onnxruntime vs the gateway (HTTP binary, HTTP JSON, gRPC; on the tiny model also gRPC
requests on ModelStreamInfer streams, one per client) vs a naive FastAPI endpoint vs the floors of a Python server
(a bare ASGI app and a bare grpc.aio server, unary and streaming, that parse the request and answer a fixed
response: http_floor.py, grpc_floor.py) vs a local Triton's own HTTP front end (when `make install` put one under
.triton/), for both example models, in one run on loopback. Prints a table with each server's CPU per
request and the ratios the issues target, and writes a PNG (throughput and p99 vs concurrency).

Each measurement is a bounded closed loop: N clients, each sending its next request when the previous answer
arrived, for a fixed time after a short warmup. The servers run as separate processes; on a small box they share
the CPU with this load generator, so modes are measured one after the other (alternating at each concurrency
level) and compared as ratios. CPU per request is read from /proc around each run, over warmup and measured time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from clients import binary_body, json_body, run_grpc, run_grpc_stream, run_http
from cpu import cpu_seconds, process_group
from inprocess import run_inprocess
from naive_app import serve_naive
from options import bench_parser
from plot import plot
from processes import free_ports, gateway_command, grpc_process, process
from report import median_rounds, print_report
from result import Result
from tritonclient.grpc import service_pb2
from workload import MODELS, ROOT, ensure_repository, export_first_versions, latest_onnx

from services.tritonlocal import LocalTriton, TritonInstall

STREAMED = "mlp"
"""The model whose gRPC requests also run on streams: on the tiny one, the per-request cost of the front end shows."""


async def measure(
    args: argparse.Namespace, urls: dict[str, str], pids: dict[str, int], ceilings: dict[str, Path]
) -> list[Result]:
    """``urls``/``pids`` by server: gateway, grpc (the gateway's gRPC target), naive, floor, grpc-floor, triton.
    ``ceilings``: each model's ONNX file, run in this process at batch 32 beside the gateway at the top level."""
    results: list[Result] = []
    rng = np.random.default_rng(1)
    json_headers = {"Content-Type": "application/json"}
    top = max(args.concurrency)
    for model, (name, shape) in MODELS.items():
        row = rng.standard_normal((1, *shape)).astype(np.float32)
        binary, binary_headers = binary_body(name, row)
        plain = json_body(name, row)
        naive_body = json.dumps({"data": row.tolist()}).encode()
        request = service_pb2.ModelInferRequest(model_name=model)
        request.inputs.add(name=name, datatype="FP32", shape=list(row.shape))
        request.raw_input_contents.append(row.tobytes())
        infer = f"/v2/models/{model}/infer"
        for concurrency in args.concurrency:
            c, d, w = concurrency, args.duration, args.warmup
            gateway, floor, naive = urls["gateway"] + infer, urls["floor"] + infer, f"{urls['naive']}/predict/{model}"
            # The ratios the targets read are taken at the top level: there every mode runs in several rounds, in
            # flipped order each round, and each ratio pairs the runs of one round (the report takes the median).
            for round_index in range(args.rounds if concurrency == top else 1):
                # Each gateway mode runs right beside what its ratio divides it by (the ceiling, the gRPC floor,
                # the HTTP floor and Triton on either side of HTTP JSON): this machine's speed drifts by 10-20%
                # within seconds, and a pair measured back to back shares most of that drift. The naive endpoint,
                # whose targets are met several times over, goes last.
                runs: list[tuple[str, str, Coroutine[Any, Any, tuple[int, float, list[float]]]]] = [
                    ("http-binary", "gateway", run_http(gateway, binary, binary_headers, c, d, w)),
                    ("grpc", "gateway", run_grpc(urls["grpc"], request, c, d, w)),
                    ("floor-grpc", "grpc-floor", run_grpc(urls["grpc-floor"], request, c, d, w)),
                    ("floor-json", "floor", run_http(floor, plain, json_headers, c, d, w)),
                    ("http-json", "gateway", run_http(gateway, plain, json_headers, c, d, w)),
                ]
                if "triton" in urls:
                    triton = urls["triton"] + infer
                    runs.append(("triton-json", "triton", run_http(triton, plain, json_headers, c, d, w)))
                runs.append(("naive-json", "naive", run_http(naive, naive_body, json_headers, c, d, w)))
                if model == STREAMED:  # the stream beside both its floor and the unary calls it is compared with
                    runs[1:1] = [
                        ("floor-grpc-stream", "grpc-floor", run_grpc_stream(urls["grpc-floor"], request, c, d, w)),
                        ("grpc-stream", "gateway", run_grpc_stream(urls["grpc"], request, c, d, w)),
                    ]
                if concurrency == top:  # the ceiling next to the gateway's runs, not minutes before them
                    runs.insert(1, ("in-process b32", "", _inprocess(model, ceilings[model], args)))
                for mode, server, run in runs if round_index % 2 == 0 else reversed(runs):
                    # Triton's CPU includes its python-backend stubs, which run in its process group.
                    watched = process_group(pids[server]) if server == "triton" else [pids[server]] if server else []
                    before = cpu_seconds(watched)
                    count, seconds, latencies = await run
                    spent = cpu_seconds(watched) - before
                    if not server:
                        result = Result(model, mode, 32, count, seconds, latencies, 32, round=round_index)
                        print(f"  {model:<10} {mode:<17} {result.throughput:8.0f} rows/s "
                              f"p50 {result.percentile(50):6.2f} ms", flush=True)
                        results.append(result)
                        continue
                    result = Result(model, mode, concurrency, count, seconds, latencies, round=round_index)
                    # The CPU was read around warmup + measured window: spread it over that many requests.
                    result.cpu_ms = spent * 1e3 / max(result.throughput * (seconds + args.warmup), 1.0)
                    results.append(result)
                    print(
                        f"  {model:<10} {mode:<17} c={concurrency:<3} {result.throughput:8.0f} rows/s "
                        f"p50 {result.percentile(50):6.2f} ms p99 {result.percentile(99):6.2f} ms "
                        f"CPU {result.cpu_ms:.3f} ms/req",
                        flush=True,
                    )
    return results


async def _inprocess(model: str, path: Path, args: argparse.Namespace) -> tuple[int, float, list[float]]:
    """The in-process ceiling as a run of the list: it blocks the loop, which has nothing else to do meanwhile."""
    result = run_inprocess(model, path, 32, args.threads, args.duration, args.warmup)
    return result.requests, result.seconds, result.latencies_ms


def local_triton(repository: Path, logs: Path, wanted: bool) -> contextlib.AbstractContextManager[LocalTriton | None]:
    """A local CPU Triton serving the examples (python-backend twins running onnxruntime), when one is installed."""
    if not wanted or not TritonInstall.default().present():
        if wanted:
            print("no local Triton under .triton/ (run `make install`): its HTTP front end is left out", flush=True)
        return contextlib.nullcontext()
    return LocalTriton(repository, load=tuple(MODELS), derived=logs / "derived", log_file=logs / "tritonserver.log")


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="intra-op threads of the in-process runs and the naive baseline, and of the gateway's "
                             "instances together (each of a model's instances gets its share)")
    parser.add_argument("--plot", type=Path, default=ROOT / "loadtests" / "results" / "bench.png")
    parser.add_argument("--no-triton", action="store_true", help="leave out the local Triton's HTTP front end")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds at the top client count, in flipped order; each target is the median round's")
    parser.add_argument("--serve-naive", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_naive:
        serve_naive(args.repository, args.serve_naive, args.threads)
        return
    repository = ensure_repository(args.repository.resolve(), "switchyard-bench-", export_first_versions)

    results: list[Result] = []
    print(f"in-process onnxruntime ({args.threads} intra-op threads):")
    for model in MODELS:
        for batch in (1, 32):
            result = run_inprocess(
                model, latest_onnx(repository, model), batch, args.threads, args.duration, args.warmup
            )
            result.round = -1  # before the servers start: the targets pair the ceiling run beside the gateway's
            results.append(result)
            print(
                f"  {model:<10} batch {batch:<3} {result.throughput:8.0f} rows/s p50 {result.percentile(50):6.2f} ms",
                flush=True,
            )

    http_port, grpc_port, naive_port, floor_port, grpc_floor_port = free_ports(5)
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-logs-"))
    gateway = gateway_command(repository, http_port, grpc_port)
    # The baseline is this script again, so it runs with the same interpreter and path as the bench.
    baseline = [sys.executable, str(Path(__file__).resolve()), "--repository", str(repository),
                "--threads", str(args.threads), "--serve-naive", str(naive_port)]  # fmt: skip
    floor = [sys.executable, str(ROOT / "loadtests" / "http_floor.py"), str(floor_port)]
    grpc_floor = [sys.executable, str(ROOT / "loadtests" / "grpc_floor.py"), "--answer", str(grpc_floor_port)]
    # Equal threads: the gateway's default gives each of a model's instances CPU count / instances threads, so
    # its instances together use what one in-process session does. Only another --threads needs the override.
    if args.threads != (os.cpu_count() or 1):
        os.environ["SWITCHYARD_INTRA_OP_THREADS"] = str(max(1, args.threads // 2))  # the examples have 2 instances
    with (
        local_triton(repository, logs, not args.no_triton) as triton,
        process(gateway, f"http://127.0.0.1:{http_port}/v2/health/ready", logs / "gateway.log") as gateway_process,
        process(baseline, f"http://127.0.0.1:{naive_port}/health", logs / "naive.log") as naive_process,
        process(floor, f"http://127.0.0.1:{floor_port}/", logs / "floor.log") as floor_process,
        grpc_process(grpc_floor, f"127.0.0.1:{grpc_floor_port}", logs / "grpc-floor.log") as grpc_floor_process,
    ):
        urls = {"gateway": f"http://127.0.0.1:{http_port}", "grpc": f"127.0.0.1:{grpc_port}",
                "naive": f"http://127.0.0.1:{naive_port}", "floor": f"http://127.0.0.1:{floor_port}",
                "grpc-floor": f"127.0.0.1:{grpc_floor_port}"}  # fmt: skip
        pids = {"gateway": gateway_process.pid, "naive": naive_process.pid, "floor": floor_process.pid,
                "grpc-floor": grpc_floor_process.pid}  # fmt: skip
        if triton is not None:
            assert triton.pid is not None
            urls["triton"], pids["triton"] = f"http://{triton.http_url}", triton.pid
            time.sleep(1.0)  # its python-backend stubs finish starting
        print("gateway vs baselines (closed loop, loopback):")
        ceilings = {model: latest_onnx(repository, model) for model in MODELS}
        results += uvloop.run(measure(args, urls, pids, ceilings))
    print_report(results)
    plot(median_rounds(results), args.plot)


if __name__ == "__main__":
    main()
