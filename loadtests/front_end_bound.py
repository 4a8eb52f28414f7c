"""How close a front end could come to `make bench`'s in-process ceiling on this machine: the bound its CNN line
(gateway HTTP binary, 32 clients, vs onnxruntime alone at batch 32 with every thread) is read against.

On a small box the front end, its clients and the model share the cores the ceiling has to itself. This script
measures, round by round and in flipped order each round:
- **ceiling**: ``in-process b32`` as make bench runs it (one session with every intra-op thread);
- **layout**: the model as the gateway lays it out (its ``instance_group`` count of sessions, each with its share of
  the threads, each running batches of 32 / instances rows on its own thread), alone;
- **gateway**: the gateway, HTTP binary, 32 clients (make bench's run);
- **bound**: the layout again, beside the HTTP floor (``http_floor.py --binary``: parse the request, answer a fixed
  one) that the same 32 clients drive at the rate the gateway reached in that round. A front end costing what the
  floor costs per request, and handing rows to the model for free, would do no better than this.
The model runs in a process of its own (as the gateway's threads run beside its event loop, and the ceiling runs
with no front end at all). It prints each round and the medians of each run over the ceiling of its round.

Usage: ``python loadtests/front_end_bound.py [--model classifier] [--rounds 5] [--repository DIR]``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import uvloop
from clients import binary_body, run_http
from inprocess import run_inprocess
from options import bench_parser
from processes import free_port, free_ports, gateway_command, process
from workload import MODELS, ROOT, ensure_repository, export_first_versions, latest_onnx

from services.modelrepo.config import read_config

CLIENTS = 32
LOAD_MARGIN_S = 1.5
"""Extra seconds of load around the model's measured window in a bound run: its process starts its sessions while
the clients already run, and must not measure after they stop."""


def layout_rate(
    path: str, model: str, instances: int, threads: int, warmup: float, duration: float
) -> tuple[float, float, float]:
    """Rows per second of ``instances`` sessions of ``threads`` intra-op threads each, every one on its own thread
    running batches of ``CLIENTS / instances`` rows; with the wall-clock start and end of the measured window."""
    name, shape = MODELS[model]
    rows = max(1, CLIENTS // instances)
    data = np.random.default_rng(0).standard_normal((rows, *shape)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # the gateway's default
    sessions = [ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]) for _ in range(instances)]
    start = time.time() + warmup
    end = start + duration
    counts = [0] * instances

    def run(index: int) -> None:
        session = sessions[index]
        while (now := time.time()) < end:
            session.run(None, {name: data})
            if now >= start:
                counts[index] += rows

    workers = [threading.Thread(target=run, args=(i,)) for i in range(instances)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / duration, start, end


def ceiling_rate(path: str, model: str, threads: int, warmup: float, duration: float) -> float:
    return run_inprocess(model, Path(path), 32, threads, duration, warmup).throughput


async def bound_run(
    pool: concurrent.futures.ProcessPoolExecutor,
    floor_url: str,
    body: bytes,
    headers: dict[str, str],
    layout: tuple[str, str, int, int, float, float],
) -> tuple[float, float, bool]:
    """The layout's rate beside the floor's clients, the floor's rate, and whether the clients ran (past their own
    warmup) through the whole of the layout's measured window. The layout warms up for ``LOAD_MARGIN_S`` while the
    clients settle, and the clients run ``LOAD_MARGIN_S`` past the window's expected end."""
    duration = layout[5]
    began = time.time()
    model_run = asyncio.wrap_future(pool.submit(layout_rate, *layout[:4], LOAD_MARGIN_S, duration))
    load = run_http(floor_url, body, headers, CLIENTS, duration + 2 * LOAD_MARGIN_S, LOAD_MARGIN_S)
    requests, seconds, _ = await load
    rate, start, end = await model_run
    covered = began + LOAD_MARGIN_S <= start and end <= began + LOAD_MARGIN_S + seconds
    return rate, requests / seconds, covered


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[CLIENTS])
    parser.add_argument("--model", choices=sorted(MODELS), default="classifier")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="intra-op threads of the ceiling, and of the layout's sessions together")  # fmt: skip
    args = parser.parse_args()
    repository = ensure_repository(args.repository.resolve(), "switchyard-bound-", export_first_versions)
    path = latest_onnx(repository, args.model)
    instances = max((group.count for group in read_config(repository / args.model).instance_group), default=1) or 1
    per_instance = max(1, args.threads // instances)
    if args.threads != (os.cpu_count() or 1):
        os.environ["SWITCHYARD_INTRA_OP_THREADS"] = str(per_instance)  # the gateway's instances get the same
    name, shape = MODELS[args.model]
    body, headers = binary_body(name, np.random.default_rng(1).standard_normal((1, *shape)).astype(np.float32))
    layout = (str(path), args.model, instances, per_instance, args.warmup, args.duration)
    print(
        f"{args.model}: ceiling 1 session x {args.threads} threads at batch 32; layout {instances} session(s) x "
        f"{per_instance} thread(s) at batch {max(1, CLIENTS // instances)}; {CLIENTS} clients",
        flush=True,
    )
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bound-logs-"))
    http_port, grpc_port = free_ports(2)
    ratios: dict[str, list[float]] = {"layout": [], "gateway": [], "bound": []}
    with (
        concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool,
        process(
            gateway_command(repository, http_port, grpc_port),
            f"http://127.0.0.1:{http_port}/v2/health/ready",
            logs / "gateway.log",
        ),
    ):
        gateway_url = f"http://127.0.0.1:{http_port}/v2/models/{args.model}/infer"
        uvloop.run(run_http(gateway_url, body, headers, CLIENTS, 1.0, args.warmup))  # the gateway settles
        for round_index in range(args.rounds):
            figures: dict[str, float] = {}
            steps = ["ceiling", "layout", "gateway and bound"]
            for step in steps if round_index % 2 == 0 else reversed(steps):
                if step == "ceiling":
                    ceiling = pool.submit(ceiling_rate, str(path), args.model, args.threads, *layout[4:])
                    figures["ceiling"] = ceiling.result()
                elif step == "layout":
                    figures["layout"] = pool.submit(layout_rate, *layout).result()[0]
                else:  # the bound is taken at the gateway's rate of this round
                    requests, seconds, _ = uvloop.run(
                        run_http(gateway_url, body, headers, CLIENTS, args.duration, args.warmup)
                    )
                    figures["gateway"] = rate = requests / seconds
                    figures["bound"], floor_rate, covered = _bound(pool, layout, body, headers, rate, logs)
            for key in ratios:
                ratios[key].append(figures[key] / figures["ceiling"])
            shown = f"ceiling {figures['ceiling']:.0f}" + "".join(
                f" | {key} {figures[key]:.0f} ({ratios[key][-1]:.2f}x)" for key in ratios
            )
            note = "" if covered else "; the clients did not cover the bound's run"
            print(f"round {round_index + 1}: {shown} rows/s (floor answering {floor_rate:.0f} requests/s{note})")
    medians = ", ".join(f"{key} {statistics.median(values):.2f}x" for key, values in ratios.items())
    print(f"\nmedians over the ceiling of each round: {medians}")


def _bound(
    pool: concurrent.futures.ProcessPoolExecutor,
    layout: tuple[str, str, int, int, float, float],
    body: bytes,
    headers: dict[str, str],
    rate: float,
    logs: Path,
) -> tuple[float, float, bool]:
    """The floor started to answer ``CLIENTS`` closed-loop clients at about ``rate``, and the bound run beside it."""
    port = free_port()
    hold_ms = max(0.0, CLIENTS / rate - 0.0015) * 1e3  # less what the loopback round trip itself takes
    floor = [sys.executable, str(ROOT / "loadtests" / "http_floor.py"), str(port), "--binary",
             "--answer-after-ms", f"{hold_ms:.2f}"]  # fmt: skip
    with process(floor, f"http://127.0.0.1:{port}/", logs / "floor.log"):
        return uvloop.run(bound_run(pool, f"http://127.0.0.1:{port}/v2/models/bound/infer", body, headers, layout))


if __name__ == "__main__":
    main()
