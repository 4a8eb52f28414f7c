"""`make bench` (Triton path): a local Triton called directly vs through the gateway (``--backend triton``),
over gRPC (tritonclient.grpc.aio on both sides) and HTTP with binary tensors, at 1 and 32 concurrent
clients, for both example models. Prints a table and the ratios the Triton issue targets.

At the top client count the tiny model also runs on gRPC streams (``ModelStreamInfer`` through tritonclient's
``stream_infer``, one stream per client): ``triton-grpc-stream`` straight to Triton's own streaming front end,
``gateway-grpc-stream`` through the gateway. They run after everything else, and a failed stream run (the local CPU
Triton's python backend has crashed under them) leaves them out of the report instead of ending the bench.

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
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import uvloop
from clients import StreamAnswerError, binary_body, run_http, run_tritonclient_grpc, run_tritonclient_stream
from cpu import Processes, Usage, cpu_seconds
from options import bench_parser
from processes import free_ports, gateway_command, grpc_process, process
from report import print_triton_report
from result import Result
from workload import MODELS, ROOT, ensure_repository, export_all_versions

from services.tritonlocal import LocalTriton

MODES = ("triton-grpc", "gateway-grpc", "floor-grpc", "triton-http", "gateway-http")
STREAM_MODES = ("triton-grpc-stream", "gateway-grpc-stream")
STREAMED = "mlp"
"""The model (at the top client count only) whose requests also run on streams: kept to one level, the run stays
short, and the tiny model shows the front ends' own cost."""
Run = Coroutine[Any, Any, tuple[int, float, list[float]]]


async def measure(
    args: argparse.Namespace, triton: LocalTriton, http: str, targets: dict[str, str], procs: Processes
) -> tuple[list[Result], dict[tuple[str, str, int], Usage]]:
    """Results per (model, mode, concurrency), and the CPU ms per request (hop, Triton, load generator)."""
    results: list[Result] = []
    cpu: dict[tuple[str, str, int], Usage] = {}
    rng = np.random.default_rng(1)
    rows = {model: rng.standard_normal((1, *MODELS[model][1])).astype(np.float32) for model in args.models}
    for model, row in rows.items():
        name = MODELS[model][0]
        body, headers = binary_body(name, row)
        for concurrency in args.concurrency:

            def unary(mode: str, model: str = model, name: str = name, row: np.ndarray = row,
                      concurrency: int = concurrency, body: bytes = body, headers: dict[str, str] = headers) -> Run:
                if mode.endswith("grpc"):
                    return run_tritonclient_grpc(targets[mode], model, name, row, concurrency, args.duration,
                                                 args.warmup)
                target = http if mode == "gateway-http" else f"http://{triton.http_url}"
                return run_http(f"{target}/v2/models/{model}/infer", body, headers, concurrency, args.duration,
                                args.warmup)

            await _measure_level(args, procs, (model, concurrency), MODES, unary, (results, cpu))
    if STREAMED in rows:
        # Last, so that a front end failing under streams (see docs/benchmarks.md) costs none of the runs above.
        top, name = max(args.concurrency), MODELS[STREAMED][0]

        def streamed(mode: str) -> Run:
            return run_tritonclient_stream(targets[mode.removesuffix("-stream")], STREAMED, name, rows[STREAMED],
                                           top, args.duration, args.warmup)

        try:
            await _measure_level(args, procs, (STREAMED, top), STREAM_MODES, streamed, (results, cpu))
        except (grpc.RpcError, StreamAnswerError) as exc:
            print(f"  the stream runs failed and are left out of the report: {exc}", flush=True)
    return results, cpu


async def _measure_level(
    args: argparse.Namespace,
    procs: Processes,
    level: tuple[str, int],
    modes: tuple[str, ...],
    run_of: Callable[[str], Run],
    into: tuple[list[Result], dict[tuple[str, str, int], Usage]],
) -> None:
    """``args.rounds`` alternating rounds of ``modes`` at one (model, concurrency); each mode's median round goes
    ``into`` the results and CPU figures, only once every round of every mode ran."""
    model, concurrency = level
    rounds: dict[str, list[tuple[Result, Usage]]] = {mode: [] for mode in modes}
    for round_index in range(args.rounds):
        # Alternate direct and gateway, and flip the order every round, so drift hits both alike.
        for mode in modes if round_index % 2 == 0 else tuple(reversed(modes)):
            run = run_of(mode)
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
            print(f"  {model:<10} {mode:<19} c={concurrency:<3} {result.throughput:7.0f} req/s "
                  f"p50 {result.percentile(50):6.2f} ms p99 {result.percentile(99):6.2f} ms "
                  f"max {max(latencies, default=0):6.0f} ms | CPU ms/req hop {usage[0]:.2f} "
                  f"triton {usage[1]:.2f} client {usage[2]:.2f}", flush=True)
    results, cpu = into
    for mode in modes:
        ranked = sorted(rounds[mode], key=lambda pair: pair[0].throughput)
        median, usage = ranked[len(ranked) // 2]
        results.append(median)
        cpu[(model, mode, concurrency)] = usage


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[1, 32])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per level; the median counts")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    args = parser.parse_args()
    repository = ensure_repository(args.repository.resolve(), "switchyard-bench-triton-", export_all_versions)
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-triton-logs-"))
    triton = LocalTriton(repository, load=tuple(MODELS), derived=logs / "derived", log_file=logs / "tritonserver.log")
    http_port, grpc_port, floor_port = free_ports(3)
    gateway = gateway_command(repository, http_port, grpc_port, "--backend", "triton", "--triton-url", triton.grpc_url,
                              "--triton-http-url", triton.http_url)
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
    print_triton_report(results, cpu)


if __name__ == "__main__":
    main()
