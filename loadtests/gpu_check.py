"""`make gpu-check` (issue #34): the example classifier served as TorchScript on CUDA through the embedded backend,
sized for a lent GPU machine (16 cores, no network, 15 minutes all told; the whole run takes ~3-5 minutes).

1. The environment: torch and its CUDA device, onnxruntime's providers, the cores. ``--device cuda`` without CUDA in
   torch stops here with exit status 2 (so does a missing package the gateway needs, named).
2. A repository in a temporary folder: the classifier traced to TorchScript (max batch 128, dynamic batching) with
   a ``KIND_GPU`` instance group on GPU 0 (``--device cpu``: ``KIND_CPU``, the dry run a CPU machine can do).
3. The ceiling: the TorchScript module called in this process on the device at batch 1, 32 and 128, numpy in and
   numpy out (images/s).
4. ``switchyard serve`` with 1 worker and with ``--workers`` workers: first parity (the gateway's answers against
   eager PyTorch on the CPU, within the exporter's fp32 tolerance), then requests/s of batch-1 requests in the
   KServe v2 binary protocol at each client count, from client processes of a raw HTTP/1.1 closed loop (the
   cheapest client: the figure should be the gateway's, not the clients').

Output: a table on stdout and ``gpu_check.json`` with every figure in ``--out`` (default ``$OUT``, where the device
tool fetches from, else a temporary folder). Exit status: 0 passed, 1 parity or a run failed, 2 the machine lacks
what the check needs.

Usage: ``python loadtests/gpu_check.py [--device cuda|cpu] [--seconds S] [--workers N] [--out DIR]``; the CPU dry
run: ``python loadtests/gpu_check.py --device cpu --seconds 2 --workers 2 --clients 1,4``.

Imports of the sibling modules, torch and the gateway are made where they are used: the environment report must
come first, also on a machine that lacks one of them, and the client processes (spawned) need none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

MODEL = "classifier"
MAX_BATCH = 128
CEILING_BATCHES = (1, 32, 128)
PARITY_BATCHES = (1, 3, 32, 128)
"""Batch sizes of the parity requests: one row, an odd size, and the batcher's usual and largest batches."""
DEFAULT_CLIENTS = "1,32,128"
QUEUE_DELAY_US = 2000
"""The exporter's default; the embedded batcher spends it only while recent batches were bigger (a lone client's
request goes at once)."""
WARMUP_S = 1.0
WARMUP_CALLS = 3
CACHE_MB = 128.0
"""The 1-worker gateway's model cache, the classifier pinned in it: more than the model needs (~3 MiB measured on the
CPU), less than torch's import with it (~190 MiB) or a GPU's CUDA context: the model loads only if the gateway
charges the runtime to no model (``backends/priming.py``)."""
EXIT_FAILED = 1
EXIT_UNFIT = 2

Floats = npt.NDArray[np.float32]

if TYPE_CHECKING:
    from gpu_report import Parity, Report, Throughput


class Unfit(Exception):
    """This machine lacks what the check needs (the message says what and what to do)."""


@dataclass(frozen=True)
class Environment:
    python: str
    torch: str
    cuda_available: bool
    cuda_devices: int
    device_name: str
    cudnn_tf32: bool
    """Whether torch lets cuDNN round convolutions to TF32 (its default): a cause when parity fails on a GPU."""
    onnxruntime: str
    onnxruntime_providers: list[str]
    cores: int


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="where the model runs (cpu: the dry run a machine without a GPU can do)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per throughput run")
    parser.add_argument("--workers", type=int, default=usable_cores(),
                        help="the second gateway's worker processes (default: the cores)")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_check.json (default: $OUT, else a "
                                                                "temporary folder)")
    parser.add_argument("--clients", type=client_counts, default=client_counts(DEFAULT_CLIENTS),
                        help=f"concurrent clients of each run, comma-separated (default {DEFAULT_CLIENTS})")
    parser.add_argument("--client-processes", type=int, default=max(1, usable_cores() // 4),
                        help="processes the clients are spread over (default: a quarter of the cores)")
    parser.add_argument("--instances", type=int, default=None,
                        help="model instances per gateway worker (default: 2 on cuda, overlapping copies and "
                             "compute; 1 on cpu)")
    args = parser.parse_args(argv)
    if args.instances is None:
        args.instances = 2 if args.device == "cuda" else 1
    if args.workers < 1 or args.client_processes < 1 or args.instances < 1 or args.seconds <= 0:
        parser.error(f"--workers, --client-processes and --instances must be at least 1 and --seconds above 0; got "
                     f"{args.workers}, {args.client_processes}, {args.instances} and {args.seconds}")
    return args


def client_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected client counts like {DEFAULT_CLIENTS} (positive integers, "
                                         f"comma-separated), got {text!r}")
    return counts


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


# --- 1. the environment ------------------------------------------------------------------------------------------


def environment() -> Environment:
    """What this machine offers the check. torch and onnxruntime are required: the gateway imports both."""
    torch = _required("torch", "PyTorch runs the TorchScript model and the CPU reference")
    ort = _required("onnxruntime", "the gateway's embedded backend imports it")
    available = bool(torch.cuda.is_available())
    return Environment(
        python=sys.version.split()[0], torch=str(torch.__version__), cuda_available=available,
        cuda_devices=int(torch.cuda.device_count()) if available else 0,
        device_name=str(torch.cuda.get_device_name(0)) if available else "",
        cudnn_tf32=bool(torch.backends.cudnn.allow_tf32), onnxruntime=str(ort.__version__),
        onnxruntime_providers=list(ort.get_available_providers()), cores=usable_cores(),
    )


def print_environment(env: Environment) -> None:
    cuda = f"CUDA yes, {env.cuda_devices} device(s), 0: {env.device_name}" if env.cuda_available else "CUDA no"
    print(f"python {env.python}; torch {env.torch} ({cuda}; cuDNN TF32 {'on' if env.cudnn_tf32 else 'off'}); "
          f"onnxruntime {env.onnxruntime} ({', '.join(env.onnxruntime_providers)}); {env.cores} cores", flush=True)


def check_fit(env: Environment, device: str) -> None:
    """Raise ``Unfit`` when ``device`` cannot run here, or the gateway cannot start, naming what is missing."""
    if device == "cuda" and not env.cuda_available:
        raise Unfit(
            f"--device cuda needs CUDA in torch, and torch {env.torch} sees no CUDA device "
            "(torch.cuda.is_available() is False). The check serves the model as TorchScript because onnxruntime on "
            "the lent GPU machines has no CUDAExecutionProvider (it offers "
            f"{', '.join(env.onnxruntime_providers)} here). Run it on a machine with a GPU and a CUDA build of "
            "torch, or pass --device cpu for the dry run."
        )
    try:
        import services.gateway.app  # noqa: F401  # everything `switchyard serve` needs to start
    except ImportError as exc:
        raise Unfit(
            f"the gateway cannot start: the Python package {exc.name or exc} is not installed. On a machine with no "
            "network, carry it as a wheel with the checkout (docs/benchmarks.md, GPU check)"
        ) from exc


def _required(module: str, why: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Unfit(f"the check needs {module} ({why}), and it is not installed: {exc}") from exc


# --- 2. the repository -------------------------------------------------------------------------------------------


def build_repository(root: Path, device: str, instances: int) -> Path:
    """The classifier traced to TorchScript in ``root``, its config written through ``services.modelrepo``: on cuda a
    ``KIND_GPU`` group on GPU 0, ``instances`` of it; on cpu ``KIND_CPU``. Returns the artifact.

    Not through ``exporter.export``: its gate's checks take ~15 s on a 2-core machine, which the dry run's test
    cannot spend, and the parity step below compares the served answers with eager PyTorch anyway."""
    import torch
    from tritonclient.grpc import model_config_pb2 as mc

    from examples import models
    from services.modelrepo import layout
    from services.modelrepo.config import to_text

    version = root / MODEL / "1"
    version.mkdir(parents=True)
    with torch.inference_mode(False), torch.no_grad():
        traced = torch.jit.trace(models.build_classifier().eval(), models.classifier_inputs(2))  # type: ignore[no-untyped-call]
    artifact = version / "model.pt"
    traced.save(str(artifact))
    config = mc.ModelConfig(name=MODEL, platform=layout.TORCHSCRIPT_PLATFORM, max_batch_size=MAX_BATCH)
    config.input.add(name=models.CLASSIFIER_INPUT, data_type=mc.TYPE_FP32, dims=list(models.CLASSIFIER_SHAPE))
    config.output.add(name=models.CLASSIFIER_OUTPUT, data_type=mc.TYPE_FP32, dims=[models.CLASSIFIER_CLASSES])
    config.dynamic_batching.max_queue_delay_microseconds = QUEUE_DELAY_US
    # Each worker runs it WARMUP_CALLS times as it loads the model: TorchScript's profiling executor optimizes the
    # graph over its first calls, which would otherwise stall the first measured requests.
    warmup = config.model_warmup.add(name="random", batch_size=1, count=WARMUP_CALLS)
    warmup.inputs[models.CLASSIFIER_INPUT].data_type = mc.TYPE_FP32
    warmup.inputs[models.CLASSIFIER_INPUT].dims.extend(models.CLASSIFIER_SHAPE)
    warmup.inputs[models.CLASSIFIER_INPUT].random_data = True
    if device == "cuda":
        config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, count=instances, gpus=[0])
    else:
        config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=instances)
    (root / MODEL / layout.CONFIG_FILE).write_text(to_text(config))
    return artifact


# --- 3. the in-process ceiling -----------------------------------------------------------------------------------


def ceiling(artifact: Path, device: str, batch: int, seconds: float) -> float:
    """Images/s of the TorchScript module on ``device`` at ``batch``, numpy in and numpy out, as the gateway's runner
    moves them (one pinned copy in, one copy out)."""
    import torch

    module = torch.jit.load(str(artifact), map_location=device).eval()  # type: ignore[no-untyped-call]
    rows = np.random.default_rng(batch).standard_normal((batch, 3, 64, 64)).astype(np.float32)

    def once() -> None:
        tensor = torch.from_numpy(rows)
        if device != "cpu":
            tensor = tensor.pin_memory().to(device, non_blocking=True)
        with torch.inference_mode():
            answer = module(tensor)
        (answer if isinstance(answer, torch.Tensor) else answer[0]).cpu().numpy()

    started = time.perf_counter()
    for _ in range(WARMUP_CALLS):  # TorchScript's profiling executor optimizes the graph over its first calls
        once()
    while time.perf_counter() - started < min(WARMUP_S, seconds / 2):
        once()
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        once()
        calls += 1
    return calls * batch / (time.perf_counter() - started)


# --- 4. the gateway ----------------------------------------------------------------------------------------------


def infer_binary(port: int, rows: Floats) -> Floats:
    """The classifier's logits for ``rows``, sent and answered in the binary tensor extension."""
    from clients import binary_body
    from gpu_gateways import refusal_reason

    body, headers = binary_body("image", rows)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            header_length = int(answer.headers["Inference-Header-Content-Length"])
            payload = answer.read()
    except urllib.error.HTTPError as refused:  # the gateway's answer says why
        reason = refusal_reason(refused.code, refused.read())
        raise RuntimeError(f"the gateway refused {len(rows)} row(s): {reason}") from None
    header = json.loads(payload[:header_length])
    output = header["outputs"][0]
    logits = np.frombuffer(payload[header_length:], dtype=np.float32)
    return logits.reshape(output["shape"])


def parity(port: int, workers: int) -> Parity:
    """The gateway's answers against eager PyTorch on the CPU, within the exporter's fp32 parity tolerance (atol and
    rtol alike, as its gate uses them)."""
    import torch

    from examples import models
    from exporter.parity import DEFAULT_TOLERANCE

    tolerance = DEFAULT_TOLERANCE["fp32"]
    reference = models.build_classifier().eval()
    worst_abs = worst_rel = 0.0
    passed = True
    for batch in PARITY_BATCHES:
        inputs = models.classifier_inputs(batch, seed=100 + batch)
        with torch.inference_mode():
            expected = reference(inputs).numpy()
        served = infer_binary(port, inputs.numpy())
        if served.shape != expected.shape:
            raise RuntimeError(f"the gateway answered batch {batch} with logits of shape {served.shape}, expected "
                               f"{expected.shape}")
        difference = np.abs(served - expected)
        worst_abs = max(worst_abs, float(difference.max()))
        worst_rel = max(worst_rel, float((difference / np.maximum(np.abs(expected), 1e-12)).max()))
        passed = passed and bool(np.all(difference <= tolerance + tolerance * np.abs(expected)))
    from gpu_report import Parity

    return Parity(workers, list(PARITY_BATCHES), worst_abs, worst_rel, tolerance, tolerance, passed)


def client_shares(clients: int, processes: int) -> list[int]:
    """``clients`` spread as evenly as can be over at most ``processes`` processes (none of them empty)."""
    used = min(clients, processes)
    return [clients // used + (1 if index < clients % used else 0) for index in range(used)]


def prepare_client() -> None:
    """Each client process imports its client before the first run: on a small machine the import's CPU would
    otherwise come out of the first run's figure."""
    import clients  # noqa: F401


def client_run(port: int, clients: int, seconds: float) -> tuple[int, float]:
    """One client process: ``clients`` keep-alive connections in a closed loop of batch-1 binary requests; the
    requests answered in the measured ``seconds`` and the seconds it measured. The window stretches until each
    client was answered at least once: on a busy machine a short window could otherwise hold no answer at all."""
    from clients import binary_body, run_http

    row = np.random.default_rng(clients).standard_normal((1, 3, 64, 64)).astype(np.float32)
    body, headers = binary_body("image", row)
    url = f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer"
    try:
        import uvloop  # cheaper per request than asyncio's own loop, where it is installed

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    count, measured, _ = runner(run_http(url, body, headers, clients, seconds, min(WARMUP_S, seconds / 4), clients))
    return int(count), float(measured)


def throughput(pool: Any, port: int, workers: int, clients: int, processes: int, seconds: float) -> Throughput:
    shares = client_shares(clients, processes)
    runs = pool.starmap(client_run, [(port, share, seconds) for share in shares])
    requests = sum(count for count, _ in runs)
    rate = sum(count / measured for count, measured in runs if measured > 0)
    from gpu_report import Throughput

    return Throughput(workers, clients, len(shares), requests, rate)


# --- the run -----------------------------------------------------------------------------------------------------


@contextmanager
def phase(report: Report, name: str) -> Iterator[None]:
    started = time.monotonic()
    print(f"-- {name}", flush=True)
    try:
        yield
    finally:
        report.phase_seconds[name] = round(time.monotonic() - started, 2)


def serve_and_measure(report: Report, args: argparse.Namespace, repository: Path, logs: Path) -> None:
    """Parity and throughput with 1 worker, then with ``--workers`` (once, when that is 1 too)."""
    from gpu_gateways import cache_charge_mb, gateways

    torch_device = "cuda:0" if args.device == "cuda" else "cpu"
    counts = sorted({1, args.workers})
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(args.client_processes, initializer=prepare_client) as pool, ExitStack() as stack:
        with phase(report, f"gateways start ({' and '.join(map(str, counts))} worker(s) on {torch_device})"):
            ports = stack.enter_context(gateways(repository, MODEL, counts, logs, cache_mb=CACHE_MB))
        report.cache_charged_mb = cache_charge_mb(ports[1], MODEL)
        if report.cache_charged_mb is None:
            report.failures.append(f"the 1-worker gateway's model cache does not count {MODEL} (its /metrics)")
        for workers, port in ports.items():
            with phase(report, f"gateway, {workers} worker(s)"):
                measure(report, pool, port, workers, args)


def measure(report: Report, pool: Any, port: int, workers: int, args: argparse.Namespace) -> None:
    checked = parity(port, workers)
    report.parity.append(checked)
    print(f"   parity {'ok' if checked.passed else 'FAILED'}: max abs {checked.max_abs_error:.3g}, max rel "
          f"{checked.max_rel_error:.3g} (atol = rtol = {checked.atol:g})", flush=True)
    for clients in args.clients:
        measured = throughput(pool, port, workers, clients, args.client_processes, args.seconds)
        report.throughput.append(measured)
        if not measured.requests:  # a figure of 0 req/s would read as a measurement
            from clients import STRETCH_FLOOR_S, STRETCH_LIMIT

            longest = max(args.seconds * STRETCH_LIMIT, STRETCH_FLOOR_S)
            report.failures.append(
                f"gateway, {workers} worker(s), {clients} clients: no request was answered within the measured "
                f"{args.seconds:g} s, nor in the {longest:g} s the window may stretch to; see the gateway's log"
            )
        print(f"   {clients:>4} clients: {measured.requests_per_s:9.0f} req/s", flush=True)


def run_check(args: argparse.Namespace, env: Environment, out: Path) -> Report:
    from gpu_report import Report

    report = Report(args.device, env, args.instances, args.seconds, CACHE_MB)
    torch_device = "cuda:0" if args.device == "cuda" else "cpu"
    work = Path(tempfile.mkdtemp(prefix="switchyard-gpu-check-"))
    try:
        with phase(report, "export"):
            artifact = build_repository(work / "repository", args.device, args.instances)
        with phase(report, f"in-process ceiling on {torch_device}"):
            for batch in CEILING_BATCHES:
                report.ceiling_images_per_s[batch] = ceiling(artifact, torch_device, batch, args.seconds / 4)
                print(f"   batch {batch:>3}: {report.ceiling_images_per_s[batch]:9.0f} images/s", flush=True)
        serve_and_measure(report, args, work / "repository", work)
    except Exception as exc:  # the figures so far still go out: a lent machine's minutes are not spent twice
        report.failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        report.write(out)
        keep_logs(work, out)
        shutil.rmtree(work, ignore_errors=True)
    return report


def keep_logs(work: Path, out: Path) -> None:
    """The gateways' logs beside the figures: they name the device of every instance at load, and why a run
    failed."""
    out.mkdir(parents=True, exist_ok=True)
    for log in sorted(work.glob("gateway-*.log")):
        shutil.copyfile(log, out / log.name)


def output_folder(requested: Path | None) -> Path:
    if requested is not None:
        return requested
    device_out = os.environ.get("OUT")
    return Path(device_out) if device_out else Path(tempfile.mkdtemp(prefix="switchyard-gpu-check-out-"))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        env = environment()
        print_environment(env)
        check_fit(env, args.device)
    except Unfit as exc:
        print(f"gpu_check: {exc}", file=sys.stderr, flush=True)
        return EXIT_UNFIT
    out = output_folder(args.out)
    report = run_check(args, env, out)
    report.print_table(out)
    return 0 if report.passed else EXIT_FAILED


if __name__ == "__main__":
    # The checkout's packages (examples, exporter, services) import from its root also where it is not installed,
    # as on a lent GPU machine; the sibling modules import from this folder, sys.path's first entry.
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
