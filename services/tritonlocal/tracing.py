"""Triton's own OpenTelemetry traces: the ``--trace-config`` flags that make tritonserver export its spans, read
from the same ``OTEL_*`` variables the gateway's SDK reads, so that one environment points both at one collector.

What Triton 2.51 does with them (checked against the local build, tests/tritonlocal/test_triton_traces.py):
- it exports over OTLP/HTTP only, and in OTLP/JSON (opentelemetry-cpp 1.13), to the full URL given (``.../v1/traces``);
  a collector's OTLP/HTTP receiver reads that, an OTLP/gRPC one (port 4317) does not;
- each traced request gives three spans: ``InferRequest`` (the HTTP or gRPC request), one named after the model,
  and ``compute``, with the TIMESTAMPS as span events;
- a W3C ``traceparent`` header (HTTP) or metadata entry (gRPC) makes ``InferRequest`` a child of the caller's span,
  whatever ``rate`` says, and even when the caller's sampled flag is 0; ``rate`` (1 in N) only decides for requests
  without one, 0 traces none of those.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.tritonlocal.errors import TritonLocalError

__all__ = ["TRACES_PATH", "TritonTracing", "tracing_from_environment"]

TRACES_PATH = "/v1/traces"
DEFAULT_SERVICE_NAME = "triton"
_HTTP_PROTOCOLS = ("", "http/protobuf", "http/json")


@dataclass(frozen=True)
class TritonTracing:
    """Where and how Triton exports its spans.

    ``url`` is the full OTLP/HTTP traces URL. ``rate``: one in ``rate`` requests that arrive without a trace context
    is traced (0: none; requests with a ``traceparent`` always are). ``schedule_delay_ms``: how long Triton's batch
    span processor holds ended spans before it sends them (``None``: Triton's default, 5 s; tests want less)."""

    url: str
    rate: int = 1
    service_name: str = DEFAULT_SERVICE_NAME
    schedule_delay_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise TritonLocalError(f"trace URL {self.url!r} is not an http(s) URL; Triton exports over OTLP/HTTP only")
        if self.rate < 0:
            raise TritonLocalError(f"trace rate {self.rate} is negative; expected 0 (none) or N (one in N requests)")
        if self.schedule_delay_ms is not None and self.schedule_delay_ms < 1:
            raise TritonLocalError(f"trace schedule delay {self.schedule_delay_ms} ms is not positive")

    def flags(self) -> list[str]:
        """tritonserver's command-line flags for these settings."""
        settings = [
            "mode=opentelemetry",
            f"opentelemetry,url={self.url}",
            f"opentelemetry,resource=service.name={self.service_name}",
            f"rate={self.rate}",
            "level=TIMESTAMPS",  # the only level opentelemetry mode supports (not TENSORS)
        ]
        if self.schedule_delay_ms is not None:
            settings.append(f"opentelemetry,bsp_schedule_delay={self.schedule_delay_ms}")
        return [flag for setting in settings for flag in ("--trace-config", setting)]


def tracing_from_environment(
    environ: Mapping[str, str], *, rate: int = 1, service_name: str = DEFAULT_SERVICE_NAME
) -> TritonTracing | None:
    """The settings the OpenTelemetry variables ask for, or ``None`` when they ask for no traces.

    The traces endpoint follows the OpenTelemetry rules: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is the full URL,
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` the base the signal's path is appended to. ``OTEL_TRACES_EXPORTER=none`` turns
    them off. An OTLP/gRPC protocol is refused rather than sent to a port that would not understand Triton."""
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    url = _traces_url(environ)
    if url is None:
        return None
    protocol_variable = next(
        (name for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") if environ.get(name)),
        None,
    )
    protocol = environ.get(protocol_variable, "").strip().lower() if protocol_variable else ""
    if protocol not in _HTTP_PROTOCOLS:
        raise TritonLocalError(
            f"{protocol_variable}={protocol!r}, but Triton exports traces over OTLP/HTTP only; "
            f"expected http/protobuf or http/json, with the collector's HTTP port (4318)"
        )
    return TritonTracing(url=url, rate=rate, service_name=service_name)


def _traces_url(environ: Mapping[str, str]) -> str | None:
    specific = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if specific:
        return specific
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + TRACES_PATH
    return None
