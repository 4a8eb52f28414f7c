"""`make bench`: in-process onnxruntime vs the gateway (HTTP binary, HTTP JSON, gRPC) vs a naive FastAPI
endpoint, for both example models, in one run on loopback. Prints a table with the ratios the gateway
issue targets and writes a PNG (throughput and p99 vs concurrency).

Each gateway/baseline measurement is a bounded closed loop: N clients, each sending its next request
when the previous answer arrived, for a fixed time after a short warmup. The servers run as separate
processes; on a small box they share the CPU with this load generator, so modes are measured one after
the other (alternating gateway and baseline per concurrency level) and compared as ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path

import numpy as np
import uvloop
from clients import binary_body, json_body, run_grpc, run_http
from inprocess import run_inprocess
from naive_app import serve_naive
from options import bench_parser
from plot import plot
from processes import free_port, gateway_command, process
from report import print_report
from result import Result
from tritonclient.grpc import service_pb2
from workload import MODELS, ROOT, ensure_repository, export_first_versions, latest_onnx


async def measure(args: argparse.Namespace, repository: Path, http: str, grpc_target: str, naive: str) -> list[Result]:
    results: list[Result] = []
    rng = np.random.default_rng(1)
    for model, (name, shape) in MODELS.items():
        row = rng.standard_normal((1, *shape)).astype(np.float32)
        binary, binary_headers = binary_body(name, row)
        plain = json_body(name, row)
        naive_body = json.dumps({"data": row.tolist()}).encode()
        request = service_pb2.ModelInferRequest(model_name=model)
        request.inputs.add(name=name, datatype="FP32", shape=list(row.shape))
        request.raw_input_contents.append(row.tobytes())
        json_headers = {"Content-Type": "application/json"}
        for concurrency in args.concurrency:
            # Gateway and baseline alternate at each level so that drift on the shared box hits both.
            runs: list[tuple[str, Awaitable[tuple[int, float, list[float]]]]] = [
                (
                    "http-binary",
                    run_http(
                        f"{http}/v2/models/{model}/infer",
                        binary,
                        binary_headers,
                        concurrency,
                        args.duration,
                        args.warmup,
                    ),
                ),
                (
                    "naive-json",
                    run_http(
                        f"{naive}/predict/{model}", naive_body, json_headers, concurrency, args.duration, args.warmup
                    ),
                ),
                ("grpc", run_grpc(grpc_target, request, concurrency, args.duration, args.warmup)),
                (
                    "http-json",
                    run_http(
                        f"{http}/v2/models/{model}/infer", plain, json_headers, concurrency, args.duration, args.warmup
                    ),
                ),
            ]
            for mode, run in runs:
                count, seconds, latencies = await run
                result = Result(model, mode, concurrency, count, seconds, latencies)
                results.append(result)
                print(
                    f"  {model:<10} {mode:<12} c={concurrency:<3} {result.throughput:8.0f} rows/s "
                    f"p50 {result.percentile(50):6.2f} ms p99 {result.percentile(99):6.2f} ms",
                    flush=True,
                )
    return results


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads everywhere")
    parser.add_argument("--plot", type=Path, default=ROOT / "loadtests" / "results" / "bench.png")
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
            results.append(result)
            print(
                f"  {model:<10} batch {batch:<3} {result.throughput:8.0f} rows/s p50 {result.percentile(50):6.2f} ms",
                flush=True,
            )

    http_port, grpc_port, naive_port = free_port(), free_port(), free_port()
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-logs-"))
    gateway = gateway_command(repository, http_port, grpc_port)
    # The baseline is this script again, so it runs with the same interpreter and path as the bench.
    baseline = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--repository",
        str(repository),
        "--threads",
        str(args.threads),
        "--serve-naive",
        str(naive_port),
    ]
    env_threads = {"SWITCHYARD_INTRA_OP_THREADS": str(args.threads)}
    os.environ.update(env_threads)
    with (
        process(gateway, f"http://127.0.0.1:{http_port}/v2/health/ready", logs / "gateway.log"),
        process(baseline, f"http://127.0.0.1:{naive_port}/health", logs / "naive.log"),
    ):
        print("gateway vs naive baseline (closed loop, loopback):")
        results += uvloop.run(
            measure(
                args,
                repository,
                f"http://127.0.0.1:{http_port}",
                f"127.0.0.1:{grpc_port}",
                f"http://127.0.0.1:{naive_port}",
            )
        )
    print_report(results)
    plot(results, args.plot)


if __name__ == "__main__":
    main()
