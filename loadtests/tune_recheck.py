"""Re-measures a `switchyard tune --write` result in a separate run, as clients see it: the model's config from
before the run (the ``config.pbtxt.bak-*`` it kept) and the winner (``config.pbtxt``), served side by side as two
models of one repository copy (``<model>_before``, ``<model>_after``) by one gateway (and one local Triton with
``--backend triton``), driven over HTTP with binary tensors. The two alternate at each concurrency and every round
flips their order, so drift on a shared box hits both; the table keeps each one's median-throughput round and the
p99 of all its rounds' latencies.

Usage: ``python loadtests/tune_recheck.py --model-dir REPO/MODEL [--backend triton] [--p99-ms X]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import uvloop
from clients import binary_body, run_http
from google.protobuf import text_format
from options import bench_parser
from processes import free_port, gateway_command, process
from result import Result
from tritonclient.grpc import model_config_pb2 as mc
from workload import MODELS

from services.modelrepo.config import read_config, to_text
from services.modelrepo.layout import CONFIG_FILE, WARMUP_DIR
from services.tritonlocal import LocalTriton

VARIANTS = ("before", "after")


def build(model_dir: Path, backup: Path, target: Path) -> dict[str, str]:
    """The two variants as models of one repository under ``target``; variant -> served model name."""
    model = model_dir.name
    configs = {"before": text_format.Parse(backup.read_text(), mc.ModelConfig()), "after": read_config(model_dir)}
    names = {}
    for variant, config in configs.items():
        name = names[variant] = f"{model}_{variant}"
        folder = target / name
        folder.mkdir(parents=True)
        for child in model_dir.iterdir():
            if child.is_dir() and (child.name.isdigit() or child.name == WARMUP_DIR):
                shutil.copytree(child, folder / child.name, copy_function=os.link)
        config.name = name
        (folder / CONFIG_FILE).write_text(to_text(config))
    return names


async def measure(args: argparse.Namespace, http: str, names: dict[str, str]) -> dict[tuple[str, int], Result]:
    input_name, shape = MODELS[args.model_dir.name]
    row = np.random.default_rng(1).standard_normal((1, *shape)).astype(np.float32)
    body, headers = binary_body(input_name, row)
    kept: dict[tuple[str, int], Result] = {}
    for concurrency in args.concurrency:
        runs: dict[str, list[Result]] = {variant: [] for variant in VARIANTS}
        for index in range(args.rounds):
            for variant in VARIANTS if index % 2 == 0 else tuple(reversed(VARIANTS)):
                url = f"{http}/v2/models/{names[variant]}/infer"
                count, seconds, latencies = await run_http(url, body, headers, concurrency, args.duration, args.warmup)
                result = Result(names[variant], variant, concurrency, count, seconds, latencies)
                runs[variant].append(result)
                print(f"  {variant:<6} c={concurrency:<3} {result.throughput:7.0f} req/s p50 "
                      f"{result.percentile(50):6.2f} ms p99 {result.percentile(99):7.2f} ms", flush=True)
        for variant, results in runs.items():
            median = sorted(results, key=lambda r: r.throughput)[len(results) // 2]
            pooled = [ms for r in results for ms in r.latencies_ms]
            kept[(variant, concurrency)] = Result(median.model, variant, concurrency, median.requests,
                                                  median.seconds, pooled)
    return kept


def report(kept: dict[tuple[str, int], Result], levels: list[int], slo: float | None) -> None:
    print(f"\n| config | clients | req/s | p50 ms | p99 ms |{' p99 <= SLO |' if slo else ''}")
    print(f"| --- | ---: | ---: | ---: | ---: |{' --- |' if slo else ''}")
    for variant in VARIANTS:
        for level in levels:
            r = kept[(variant, level)]
            verdict = f" {'yes' if r.percentile(99) <= slo else 'no'} |" if slo else ""
            print(f"| {variant} | {level} | {r.throughput:.0f} | {r.percentile(50):.2f} | {r.percentile(99):.2f} |"
                  f"{verdict}")
    top = levels[-1]
    gain = kept[("after", top)].throughput / max(kept[("before", top)].throughput, 1e-9)
    print(f"\nafter / before throughput at {top} clients: {gain:.2f}x")


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[1, 8, 32])
    parser.add_argument("--model-dir", type=Path, required=True, help="the tuned model's folder")
    parser.add_argument("--backup", type=Path, help="the config from before (default: the newest .bak-* there)")
    parser.add_argument("--backend", choices=("embedded", "triton"), default="embedded")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--p99-ms", type=float, help="the SLO the winner was tuned for: say which rows meet it")
    args = parser.parse_args()
    backup = args.backup or max(args.model_dir.glob(f"{CONFIG_FILE}.bak-*"))
    work = Path(tempfile.mkdtemp(prefix="switchyard-tune-recheck-"))
    names = build(args.model_dir.resolve(), backup, work / "repository")
    print(f"before: {backup}\nafter:  {args.model_dir / CONFIG_FILE}\nrepository copy: {work / 'repository'}")
    http_port, grpc_port = free_port(), free_port()
    options: tuple[str, ...] = ()
    triton = None
    if args.backend == "triton":
        triton = LocalTriton(work / "repository", load=tuple(names.values()), derived=work / "derived",
                             log_file=work / "tritonserver.log")
        triton.start()
        options = ("--backend", "triton", "--triton-url", triton.grpc_url, "--triton-local-cpu")
    command = gateway_command(work / "repository", http_port, grpc_port, *options)
    os.environ["SWITCHYARD_STATE_PATH"] = str(work / "state.json")  # the gateway's routing state: not the default
    try:
        with process(command, f"http://127.0.0.1:{http_port}/v2/health/ready", work / "gateway.log"):
            kept = uvloop.run(measure(args, f"http://127.0.0.1:{http_port}", names))
    finally:
        if triton is not None:
            triton.stop()
    report(kept, args.concurrency, args.p99_ms)


if __name__ == "__main__":
    main()
