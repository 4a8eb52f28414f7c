"""``switchyard triton``: a local CPU Triton serving an exporter repository, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from services.tritonlocal.errors import TritonLocalError

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("triton")(triton_command)


def triton_command(
    repository: Annotated[Path, typer.Option(help="Exporter model repository to serve.")] = Path("model_repository"),
    http_port: Annotated[int, typer.Option(help="HTTP (KServe v2) port; 0 picks a free one.")] = 8100,
    grpc_port: Annotated[int, typer.Option(help="gRPC (KServe v2) port; 0 picks a free one.")] = 8101,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port; 0 picks a free one.")] = 8102,
    load: Annotated[
        list[str] | None,
        typer.Option(
            "--load", help="Model to load at startup (repeatable; the others wait for a repository load call)."
        ),
    ] = None,
    derived: Annotated[
        Path | None,
        typer.Option(
            help="Where to build the python-backend copy of the repository (default: under .triton/repositories)."
        ),
    ] = None,
    log_file: Annotated[Path | None, typer.Option(help="Write the server's log here instead of the terminal.")] = None,
    sync_interval: Annotated[
        float,
        typer.Option(help="Seconds between updates of the derived repository (new exports become loadable); 0: off."),
    ] = 2.0,
    trace_rate: Annotated[
        int,
        typer.Option(
            help="With OTEL_EXPORTER_OTLP_ENDPOINT set: trace 1 in N requests that come without a traceparent "
            "(0: none); requests with one are always traced, as children of the caller's span."
        ),
    ] = 1,
) -> None:
    """Start Triton (CPU, python backend) from the nvidia-pytriton wheel in explicit model-control mode.

    Triton exports its own OpenTelemetry traces (OTLP/HTTP) when OTEL_EXPORTER_OTLP_ENDPOINT or
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set and OTEL_TRACES_EXPORTER is not "none"."""
    from services.tritonlocal.server import LocalTriton  # only this command needs the launcher
    from services.tritonlocal.tracing import tracing_from_environment

    console = Console(stderr=True, soft_wrap=True)  # paths and URLs stay on one line, copyable
    try:
        tracing = tracing_from_environment(os.environ, rate=trace_rate)
    except TritonLocalError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    server = LocalTriton(
        repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        load=load or (),
        derived=derived,
        log_file=log_file,
        tracing=tracing,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        server.start()
        if sync_interval > 0:
            server.follow(sync_interval)
        console.print(
            f"[green]tritonserver ready[/green] in {time.monotonic() - started:.1f} s, pid {server.pid}\n"
            f"  HTTP     http://{server.http_url}\n  gRPC     {server.grpc_url}\n  metrics  {server.metrics_url}\n"
            f"  serving  {escape(str(server.derived_root))} (from {escape(str(server.source))})\n"
            f"  models   {escape(', '.join(sorted(server.repository.models))) or 'none'}"
            f" ({'loaded: ' + ', '.join(load) if load else 'none loaded; load them over gRPC'})\n"
            f"  traces   {_describe_tracing(tracing.url, trace_rate) if tracing else 'off'}\n"
            + ("" if log_file else "  (Triton's error line 'CudaDriverHelper has not been initialized.' says it found "
                                   "no GPU: harmless, models run on the CPU)\n")
            + "Ctrl-C stops it."
        )
        while not stop.wait(0.5):
            if not server.running:
                crash = server.crash_report() or "tritonserver exited"
                server.stop()
                console.print(f"[red]error:[/red] {escape(crash)}")
                raise typer.Exit(1)
        console.print("stopping tritonserver ...")
        code = server.stop()
        console.print(f"tritonserver stopped (exit code {code})")
    except TritonLocalError as exc:
        server.kill()
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _describe_tracing(url: str, rate: int) -> str:
    untraced = "no others" if rate == 0 else "every request without one" if rate == 1 else f"1 in {rate} without one"
    return f"{escape(url)} (requests with a traceparent, {untraced})"
