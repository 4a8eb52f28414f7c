"""`make bench` (observability): what tracing and the inference log cost, on the tiny model at 32 clients over HTTP
JSON, one gateway process each, loaded by `wrk` (as the workers bench: a C load generator leaves the CPU to the
gateway). Three gateways side by side, measured in alternating order ``--rounds`` times:

- ``off``: neither is configured (the default; the request path reads one ``None``);
- ``traced``: tracing on at 100 % sampling (``OTEL_TRACES_SAMPLER=always_on``, every stage recorded), exporting
  over OTLP/HTTP to a receiver in this process that answers every export and keeps nothing;
- ``request``: the same with ``SWITCHYARD_TRACE_DETAIL=request`` (the server span only);
- ``logged``: the inference log at 100 % into a JSON-lines folder.

Prints req/s and the gateway's CPU per request (its process group's, from /proc) for each, and what tracing and the
log add per request. Usage: ``python loadtests/bench_observability.py``.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench_workers import bodies, gateway, run_load
from cpu import cpu_seconds, process_group
from options import bench_parser
from workload import ensure_repository, export_all_versions

MODEL = "mlp"


class _Accepting(BaseHTTPRequestHandler):
    """Answers every OTLP export with 200 and an empty (valid) ExportTraceServiceResponse."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def main() -> None:
    parser = bench_parser(__doc__, concurrency=[32])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; each figure reads the median")
    args = parser.parse_args()
    clients, seconds = max(args.concurrency), max(int(args.duration), 3)
    if shutil.which("wrk") is None:
        print("bench_observability: wrk not found (apt-get install wrk): skipped")
        return
    repository = ensure_repository(args.repository.resolve(), "switchyard-bench-observability-", export_all_versions)
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-observability-"))
    script, _ = bodies(logs)
    print(f"tracing and the inference log ({MODEL}, HTTP JSON, {clients} clients; logs in {logs}):", flush=True)
    with receiver() as endpoint:
        configs = {
            "off": {},
            "traced": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on"},
            "request": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on",
                        "SWITCHYARD_TRACE_DETAIL": "request"},
            "logged": {"SWITCHYARD_INFERENCE_LOG": f"file://{logs / 'inference-log'}"},
        }
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
        with contextlib.ExitStack() as stack:
            gateways = {name: stack.enter_context(gateway(repository, 1, logs, extra_env=env))
                        for name, env in configs.items()}
            for round_index in range(args.rounds):
                names = list(gateways)
                shift = round_index % len(names)
                order = names[shift:] + names[:shift]
                for name in order:
                    http_port, _, pid = gateways[name]
                    group = process_group(pid)
                    before, started = cpu_seconds(group), time.monotonic()
                    rate = run_load("http", http_port, script, script, clients, seconds)
                    cpu_ms = (cpu_seconds(group) - before) * 1e3 / max(rate * (time.monotonic() - started), 1.0)
                    runs[name].append((rate, cpu_ms))
                    print(f"  {name:<7} {rate:8.0f} req/s, CPU {cpu_ms:.3f} ms/req", flush=True)
    median = {name: (statistics.median(r for r, _ in found), statistics.median(c for _, c in found))
              for name, found in runs.items()}
    base_rate, base_cpu = median["off"]
    print("\nTracing and the inference log (medians of this run):")
    print(f"  off:    {base_rate:8.0f} req/s, CPU {base_cpu:.3f} ms/req")
    labels = (("traced", "tracing at 100 %"), ("request", "tracing at 100 %, server span only"),
              ("logged", "inference log at 100 %"))
    for name, label in labels:
        rate, cpu = median[name]
        print(f"  {label}: {rate:8.0f} req/s ({rate / base_rate:.2f}x), CPU {cpu:.3f} ms/req "
              f"(+{(cpu - base_cpu) * 1e3:.0f} µs per request, {cpu / base_cpu:.2f}x)")


if __name__ == "__main__":
    main()
