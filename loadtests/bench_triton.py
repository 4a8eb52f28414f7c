"""`make bench` (Triton path): a local Triton called directly vs through the gateway (``--backend triton``),
over gRPC (tritonclient.grpc.aio on both sides) and HTTP with binary tensors, at 1 and 32 concurrent
clients, for both example models. Prints a table and the ratios the Triton issue targets.

``floor-grpc`` is loadtests/grpc_floor.py, a grpc.aio pass-through that parses nothing: what one Python gRPC
hop costs here, whatever the gateway does. The CPU columns are milliseconds of CPU per request spent by the
hop (gateway or floor), by Triton (server and python-backend stubs) and by this load generator, read from
/proc over each run: Triton, the hop and the load generator share the machine's cores, so a hop's CPU is
taken from Triton's.

Each measurement is a bounded closed loop (see bench.py). The modes alternate at each level and, with
``--rounds``, repeat in flipped order; the table keeps each mode's median round.
Usage: ``python loadtests/bench_triton.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
import uvloop
from bench import Result, binary_body, closed_loop, free_port, process, run_http

from services.tritonlocal import LocalTriton

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"classifier": ("image", (3, 64, 64)), "mlp": ("features", (32,))}
MODES = ("triton-grpc", "gateway-grpc", "floor-grpc", "triton-http", "gateway-http")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Processes:
    gateway: int
    floor: int
    triton: int  # tritonserver; its python-backend stubs run in its process group

    def hop(self, mode: str) -> list[int]:
        return [self.floor] if mode.startswith("floor") else [] if mode.startswith("triton") else [self.gateway]

    def triton_group(self) -> list[int]:
        group = os.getpgid(self.triton)
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == group]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes (threads included) so far, from /proc/PID/stat."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


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


async def measure(
    args: argparse.Namespace, triton: LocalTriton, http: str, targets: dict[str, str], procs: Processes
) -> tuple[list[Result], dict[tuple[str, str, int], tuple[float, float, float]]]:
    """Results per (model, mode, concurrency), and the CPU ms per request (hop, Triton, load generator)."""
    results: list[Result] = []
    cpu: dict[tuple[str, str, int], tuple[float, float, float]] = {}
    rng = np.random.default_rng(1)
    for model in args.models:
        name, shape = MODELS[model]
        row = rng.standard_normal((1, *shape)).astype(np.float32)
        body, headers = binary_body(name, row)
        for concurrency in args.concurrency:
            rounds: dict[str, list[tuple[Result, tuple[float, float, float]]]] = {mode: [] for mode in MODES}
            for round_index in range(args.rounds):
                # Alternate direct and gateway, and flip the order every round, so drift hits both alike.
                order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    target = http if mode == "gateway-http" else f"http://{triton.http_url}"
                    if mode.endswith("grpc"):
                        run = run_grpc(targets[mode], model, name, row, concurrency, args)
                    else:
                        run = run_http(f"{target}/v2/models/{model}/infer", body, headers, concurrency, args.duration,
                                       args.warmup)
                    hop, server = procs.hop(mode), procs.triton_group()
                    before = (cpu_seconds(hop), cpu_seconds(server), time.process_time())
                    count, seconds, latencies = await run
                    after = (cpu_seconds(hop), cpu_seconds(server), time.process_time())
                    result = Result(model, mode, concurrency, count, seconds, latencies)
                    # The CPU was read around warmup + measured window: spread it over that many requests.
                    sent = max(result.throughput * (seconds + args.warmup), 1.0)
                    hop_ms, triton_ms, client_ms = ((b - a) * 1e3 / sent for a, b in zip(before, after, strict=True))
                    usage = (hop_ms, triton_ms, client_ms)
                    rounds[mode].append((result, usage))
                    print(f"  {model:<10} {mode:<13} c={concurrency:<3} {result.throughput:7.0f} req/s "
                          f"p50 {result.percentile(50):6.2f} ms p99 {result.percentile(99):6.2f} ms "
                          f"max {max(latencies, default=0):6.0f} ms | CPU ms/req hop {usage[0]:.2f} "
                          f"triton {usage[1]:.2f} client {usage[2]:.2f}", flush=True)
            for mode in MODES:
                ranked = sorted(rounds[mode], key=lambda pair: pair[0].throughput)
                median, usage = ranked[len(ranked) // 2]
                results.append(median)
                cpu[(model, mode, concurrency)] = usage
    return results, cpu


def report(results: list[Result], cpu: dict[tuple[str, str, int], tuple[float, float, float]]) -> None:
    def get(model: str, mode: str, concurrency: int) -> Result:
        return next(r for r in results if (r.model, r.mode, r.concurrency) == (model, mode, concurrency))

    print(f"\n{'model':<11} {'mode':<13} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}   CPU ms/req: "
          f"{'hop':>5} {'triton':>6} {'client':>6}")
    for r in results:
        p50, p99 = r.percentile(50), r.percentile(99)
        hop, server, client = cpu[(r.model, r.mode, r.concurrency)]
        print(f"{r.model:<11} {r.mode:<13} {r.concurrency:>4} {r.throughput:>8.0f} {p50:>8.2f} {p99:>8.2f}"
              f"               {hop:>5.2f} {server:>6.2f} {client:>6.2f}")
    top, low = max(r.concurrency for r in results), min(r.concurrency for r in results)
    print("\nGateway vs direct Triton (targets: throughput >= 0.9x at 32 clients, p50 adds <= 1 ms at 1 client):")
    ratios = []
    models = list(dict.fromkeys(r.model for r in results))
    for model in models:
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
    print("A bare Python gRPC hop (floor-grpc) vs direct Triton, and the gateway vs that floor:")
    for model in models:
        floor, direct, gateway = (get(model, mode, top) for mode in ("floor-grpc", "triton-grpc", "gateway-grpc"))
        floor_added = get(model, "floor-grpc", low).percentile(50) - get(model, "triton-grpc", low).percentile(50)
        gateway_added = get(model, "gateway-grpc", low).percentile(50) - get(model, "floor-grpc", low).percentile(50)
        print(f"  {model:<10} floor {floor.throughput / direct.throughput:.2f}x of direct at {top} clients, "
              f"+{floor_added:.2f} ms p50 at {low}; gateway {gateway.throughput / floor.throughput:.2f}x of the floor, "
              f"+{gateway_added:.2f} ms p50 over it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per level; the median counts")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    args = parser.parse_args()
    repository = ensure_repository(args.repository.resolve())
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-triton-logs-"))
    triton = LocalTriton(repository, load=tuple(MODELS), derived=logs / "derived", log_file=logs / "tritonserver.log")
    http_port, grpc_port, floor_port = free_port(), free_port(), free_port()
    gateway = [
        sys.executable, "-c", "from services.cli import main; main()", "serve", "--backend", "triton",
        "--triton-url", triton.grpc_url, "--repository", str(repository),
        "--port", str(http_port), "--grpc-port", str(grpc_port),
    ]
    os.environ["SWITCHYARD_TRITON_LOCAL_CPU"] = "1"  # serve the python-backend twins this CPU Triton runs
    floor = [sys.executable, str(ROOT / "loadtests" / "grpc_floor.py"), triton.grpc_url, str(floor_port)]
    with (
        triton,
        process(gateway, f"http://127.0.0.1:{http_port}/v2/health/ready", logs / "gateway.log") as gateway_process,
        grpc_process(floor, f"127.0.0.1:{floor_port}", logs / "floor.log") as floor_process,
    ):
        print(f"Triton pid {triton.pid} ({triton.grpc_url}); gateway on :{http_port} / :{grpc_port}; "
              f"floor on :{floor_port}; logs in {logs}")
        assert triton.pid is not None
        procs = Processes(gateway=gateway_process.pid, floor=floor_process.pid, triton=triton.pid)
        targets = {"triton-grpc": triton.grpc_url, "gateway-grpc": f"127.0.0.1:{grpc_port}",
                   "floor-grpc": f"127.0.0.1:{floor_port}"}
        results, cpu = uvloop.run(measure(args, triton, f"http://127.0.0.1:{http_port}", targets, procs))
    report(results, cpu)


@contextmanager
def grpc_process(args: list[str], target: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process serving gRPC, once its port accepts a channel."""
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=15)


if __name__ == "__main__":
    main()
