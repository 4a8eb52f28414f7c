"""`make bench` (Triton path): a local Triton called directly vs through the gateway (``--backend triton``),
over gRPC (tritonclient.grpc.aio on both sides) and HTTP with binary tensors, at 1 and 32 concurrent
clients, for both example models. Prints a table and the ratios the Triton issue targets.

Each measurement is a bounded closed loop (see bench.py). Triton, the gateway and this load generator
share the machine's cores, so the direct and gateway runs alternate at each level and, with ``--rounds``,
repeat; the table keeps each mode's median round. Usage: ``python loadtests/bench_triton.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio
import uvloop
from bench import Result, binary_body, closed_loop, free_port, process, run_http

from services.tritonlocal import LocalTriton

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"classifier": ("image", (3, 64, 64)), "mlp": ("features", (32,))}
MODES = ("triton-grpc", "gateway-grpc", "triton-http", "gateway-http")


async def run_grpc(target: str, model: str, name: str, row: np.ndarray, concurrency: int, args: argparse.Namespace
                   ) -> tuple[int, float, list[float]]:
    client = grpcaio.InferenceServerClient(target)
    tensor = grpcaio.InferInput(name, list(row.shape), "FP32")
    tensor.set_data_from_numpy(row)

    async def send() -> None:
        await client.infer(model, [tensor])

    try:
        return await closed_loop(send, concurrency, args.duration, args.warmup)
    finally:
        await client.close()


def ensure_repository(requested: Path) -> Path:
    if all((requested / model / "config.pbtxt").is_file() for model in MODELS):
        return requested
    from examples.export_examples import export_examples

    target = Path(tempfile.mkdtemp(prefix="switchyard-bench-triton-"))
    print(f"{requested} lacks the example models; exporting them to {target}", flush=True)
    export_examples(target)
    return target


async def measure(args: argparse.Namespace, triton: LocalTriton, http: str, grpc_target: str) -> list[Result]:
    results: list[Result] = []
    rng = np.random.default_rng(1)
    for model, (name, shape) in MODELS.items():
        row = rng.standard_normal((1, *shape)).astype(np.float32)
        body, headers = binary_body(name, row)
        for concurrency in args.concurrency:
            rounds: dict[str, list[Result]] = {mode: [] for mode in MODES}
            for round_index in range(args.rounds):
                # Alternate direct and gateway, and flip the order every round, so drift hits both alike.
                order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    target = http if mode == "gateway-http" else f"http://{triton.http_url}"
                    if mode.endswith("grpc"):
                        run = run_grpc(grpc_target if mode == "gateway-grpc" else triton.grpc_url, model, name, row,
                                       concurrency, args)
                    else:
                        run = run_http(f"{target}/v2/models/{model}/infer", body, headers, concurrency, args.duration,
                                       args.warmup)
                    count, seconds, latencies = await run
                    result = Result(model, mode, concurrency, count, seconds, latencies)
                    rounds[mode].append(result)
                    print(f"  {model:<10} {mode:<13} c={concurrency:<3} {result.throughput:7.0f} req/s "
                          f"p50 {result.percentile(50):6.2f} ms p99 {result.percentile(99):6.2f} ms", flush=True)
            for mode in MODES:
                ranked = sorted(rounds[mode], key=lambda r: r.throughput)
                results.append(ranked[len(ranked) // 2])
    return results


def report(results: list[Result]) -> None:
    def get(model: str, mode: str, concurrency: int) -> Result:
        return next(r for r in results if (r.model, r.mode, r.concurrency) == (model, mode, concurrency))

    print(f"\n{'model':<11} {'mode':<13} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for r in results:
        p50, p99 = r.percentile(50), r.percentile(99)
        print(f"{r.model:<11} {r.mode:<13} {r.concurrency:>4} {r.throughput:>8.0f} {p50:>8.2f} {p99:>8.2f}")
    top, low = max(r.concurrency for r in results), min(r.concurrency for r in results)
    print("\nGateway vs direct Triton (targets: throughput >= 0.9x at 32 clients, p50 adds <= 1 ms at 1 client):")
    ratios = []
    for model in MODELS:
        for protocol in ("grpc", "http"):
            gateway, direct = get(model, f"gateway-{protocol}", top), get(model, f"triton-{protocol}", top)
            ratio = gateway.throughput / direct.throughput
            ratios.append(ratio)
            gateway_p50 = get(model, f"gateway-{protocol}", low).percentile(50)
            added = gateway_p50 - get(model, f"triton-{protocol}", low).percentile(50)
            print(f"  {model:<10} {protocol:<4}: throughput at {top} clients {ratio:.2f}x "
                  f"({'ok' if ratio >= 0.9 else 'MISSED'}); p50 at {low} client(s) +{added:.2f} ms "
                  f"({'ok' if added <= 1.0 else 'MISSED'})")
    print(f"  median throughput ratio {statistics.median(ratios):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per level; the median counts")
    args = parser.parse_args()
    repository = ensure_repository(args.repository.resolve())
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-triton-logs-"))
    triton = LocalTriton(repository, load=tuple(MODELS), derived=logs / "derived", log_file=logs / "tritonserver.log")
    http_port, grpc_port = free_port(), free_port()
    gateway = [
        sys.executable, "-c", "from services.cli import main; main()", "serve", "--backend", "triton",
        "--triton-url", triton.grpc_url, "--repository", str(repository),
        "--port", str(http_port), "--grpc-port", str(grpc_port),
    ]
    os.environ["SWITCHYARD_TRITON_LOCAL_CPU"] = "1"  # serve the python-backend twins this CPU Triton runs
    with triton, process(gateway, f"http://127.0.0.1:{http_port}/v2/health/ready", logs / "gateway.log"):
        print(f"Triton pid {triton.pid} ({triton.grpc_url}); gateway on :{http_port} / :{grpc_port}; logs in {logs}")
        results = uvloop.run(measure(args, triton, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"))
    report(results)


if __name__ == "__main__":
    main()
