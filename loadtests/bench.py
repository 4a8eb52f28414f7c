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
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import uvicorn
import uvloop
from fastapi import FastAPI
from pydantic import BaseModel
from tritonclient.grpc import service_pb2, service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    # name: (input name, per-row shape)
    "classifier": ("image", (3, 64, 64)),
    "mlp": ("features", (32,)),
}


@dataclass
class Result:
    model: str
    mode: str
    concurrency: int
    requests: int
    seconds: float
    latencies_ms: list[float]
    rows_per_request: int = 1

    @property
    def throughput(self) -> float:
        """Rows (samples) per second."""
        return self.requests * self.rows_per_request / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


# ---------------------------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def process(args: list[str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[:3]} exited early; see {log}")
            try:
                with urllib.request.urlopen(ready_url, timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ready_url} not ready after 180 s; see {log}")
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


class NaiveRequest(BaseModel):
    data: list[Any]


def naive_app(repository: Path, threads: int) -> FastAPI:
    """What most teams write first: pydantic JSON body, one session.run per request, JSON lists back."""
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    def endpoint(model: str) -> Callable[[NaiveRequest], dict[str, Any]]:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(latest_onnx(repository, model)), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        input_name = session.get_inputs()[0].name

        def predict(body: NaiveRequest) -> dict[str, Any]:
            outputs = session.run(names, {input_name: np.asarray(body.data, dtype=np.float32)})
            return {"outputs": {name: value.tolist() for name, value in zip(names, outputs, strict=True)}}

        return predict

    for model in MODELS:
        app.post(f"/predict/{model}")(endpoint(model))
    return app


def serve_naive(repository: Path, port: int, threads: int) -> None:
    uvicorn.run(naive_app(repository, threads), host="127.0.0.1", port=port, log_level="warning")


def latest_onnx(repository: Path, model: str) -> Path:
    versions = sorted(int(p.name) for p in (repository / model).iterdir() if p.name.isdigit())
    return repository / model / str(versions[-1]) / "model.onnx"


# ---------------------------------------------------------------------------------------------- clients


async def closed_loop(
    send: Callable[[], Awaitable[None]], concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    latencies: list[float] = []
    clock = time.perf_counter  # uvloop's loop.time() only has millisecond resolution
    measure_from = clock() + warmup
    stop = measure_from + duration

    async def client() -> None:
        while True:
            began = clock()
            if began >= stop:
                return
            await send()
            ended = clock()
            if began >= measure_from:
                latencies.append((ended - began) * 1e3)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    measured = clock() - measure_from
    return len(latencies), measured, latencies


def binary_body(name: str, row: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(row.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": row.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return header + row.tobytes(), headers


def json_body(name: str, row: np.ndarray) -> bytes:
    tensor = {"name": name, "shape": list(row.shape), "datatype": "FP32", "data": row.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def http_request(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A complete HTTP/1.1 POST, built once and replayed: the load generator should cost little CPU."""
    path = "/" + url.split("/", 3)[3]
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def run_http(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    """Closed loop over keep-alive connections, one per client, with a minimal HTTP/1.1 reader."""
    host, port = url.split("/")[2].split(":")
    request = http_request(url, body, headers)
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(concurrency)]
    free = list(connections)

    async def send() -> None:
        reader, writer = free.pop()
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            answer = await reader.readexactly(length)
            if head[9:12] != b"200":
                raise RuntimeError(f"{url} answered {head[9:12]!r}: {answer[:300]!r}")
        finally:
            free.append((reader, writer))

    try:
        return await closed_loop(send, concurrency, duration, warmup)
    finally:
        for _, writer in connections:
            writer.close()


async def run_grpc(
    target: str, request: Any, concurrency: int, duration: float, warmup: float
) -> tuple[int, float, list[float]]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def send() -> None:
            await stub.ModelInfer(request)

        return await closed_loop(send, concurrency, duration, warmup)


def run_inprocess(model: str, path: Path, batch: int, threads: int, duration: float, warmup: float) -> Result:
    """The gateway's own session options (intra-op threads, no spinning) called in a tight loop."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name, shape = MODELS[model]
    data = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
    latencies: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < warmup:
        session.run(None, {name: data})
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < duration:
        session.run(None, {name: data})
        latencies.append((time.perf_counter() - now) * 1e3)
    return Result(model, f"in-process b{batch}", batch, len(latencies), time.perf_counter() - start, latencies, batch)


# ---------------------------------------------------------------------------------------------- report


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def report(results: list[Result], png: Path) -> None:
    print()
    print(f"{'model':<11} {'mode':<16} {'conc':>4} {'rows/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for r in results:
        print(
            f"{r.model:<11} {r.mode:<16} {r.concurrency:>4} {r.throughput:>9.0f} "
            f"{r.percentile(50):>8.2f} {r.percentile(99):>8.2f}"
        )

    def get(model: str, mode: str, concurrency: int) -> Result | None:
        for r in results:
            if (r.model, r.mode, r.concurrency) == (model, mode, concurrency):
                return r
        return None

    print("\nTargets (ratios from this run):")
    top = max(r.concurrency for r in results if r.mode == "http-binary")
    checks: list[tuple[str, Result | None, Result | None, float]] = [
        (
            "classifier: gateway HTTP binary vs in-process b32 throughput",
            get("classifier", "http-binary", top),
            get("classifier", "in-process b32", 32),
            0.9,
        ),
        (
            "classifier: gateway HTTP JSON vs naive baseline throughput",
            get("classifier", "http-json", top),
            get("classifier", "naive-json", top),
            1.25,
        ),
    ]
    for mode in ("http-binary", "grpc", "http-json"):
        checks.append(
            (
                f"mlp: gateway {mode} vs naive baseline throughput",
                get("mlp", mode, top),
                get("mlp", "naive-json", top),
                1.5,
            )
        )
    for label, gateway, baseline, target in checks:
        if gateway is None or baseline is None:
            continue
        value = gateway.throughput / baseline.throughput
        verdict = "ok" if value >= target else "MISSED"
        print(f"  {label}: {value:.2f}x (target >= {target}x) {verdict}")
    naive = get("mlp", "naive-json", top)
    for mode in ("http-binary", "grpc", "http-json"):
        gateway = get("mlp", mode, top)
        if gateway is not None and naive is not None:
            better = gateway.percentile(99) < naive.percentile(99)
            print(
                f"  mlp p99 at {top} clients, gateway {mode} {gateway.percentile(99):.2f} ms vs naive "
                f"{naive.percentile(99):.2f} ms: {'lower' if better else 'NOT lower'}"
            )
    inproc = get("mlp", "in-process b1", 1)
    for mode in ("http-binary", "grpc", "http-json"):
        gateway = get("mlp", mode, 1)
        if gateway is not None and inproc is not None:
            added = gateway.percentile(50) - inproc.percentile(50)
            verdict = "ok" if added <= 1.5 else "MISSED"
            print(f"  mlp 1 client, {mode}: p50 adds {added:.2f} ms over the in-process call (target <= 1.5) {verdict}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(MODELS), figsize=(6 * len(MODELS), 8), squeeze=False)
    for column, model in enumerate(MODELS):
        for mode in sorted({r.mode for r in results if r.model == model and not r.mode.startswith("in-process")}):
            series = sorted((r for r in results if r.model == model and r.mode == mode), key=lambda r: r.concurrency)
            xs = [r.concurrency for r in series]
            axes[0][column].plot(xs, [r.throughput for r in series], marker="o", label=mode)
            axes[1][column].plot(xs, [r.percentile(99) for r in series], marker="o", label=mode)
        for r in results:
            if r.model == model and r.mode.startswith("in-process"):
                style = ":" if r.mode.endswith("b1") else "--"
                axes[0][column].axhline(r.throughput, linestyle=style, linewidth=1, label=r.mode, color="grey")
        axes[0][column].set_yscale("log")
        axes[0][column].set_title(f"{model}: throughput")
        axes[0][column].set_ylabel("rows / s")
        axes[1][column].set_title(f"{model}: p99 latency")
        axes[1][column].set_ylabel("ms")
        for row in axes:
            row[column].set_xscale("log", base=2)
            row[column].set_xlabel("concurrent clients")
            row[column].legend(fontsize="small")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    print(f"\nplot written to {png}")


# ---------------------------------------------------------------------------------------------- main


def ensure_repository(requested: Path) -> Path:
    if all((requested / model / "config.pbtxt").is_file() for model in MODELS):
        return requested
    target = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    print(f"{requested} lacks the example models; exporting them to {target}")
    from examples import models
    from exporter import export

    export(
        models.build_classifier(),
        models.classifier_inputs(2),
        name="classifier",
        repository=target,
        input_names=["image"],
        output_names=["logits"],
    )
    export(models.build_mlp(), models.mlp_inputs(2), name="mlp", repository=target, input_names=["features"])
    return target


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads everywhere")
    parser.add_argument("--plot", type=Path, default=ROOT / "loadtests" / "results" / "bench.png")
    parser.add_argument("--serve-naive", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_naive:
        serve_naive(args.repository, args.serve_naive, args.threads)
        return
    repository = ensure_repository(args.repository.resolve())

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
    gateway = [
        sys.executable,
        "-c",
        "from services.cli import main; main()",
        "serve",
        "--repository",
        str(repository),
        "--port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
    ]
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
    report(results, args.plot)


if __name__ == "__main__":
    main()
