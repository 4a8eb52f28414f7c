"""Tracing from OpenTelemetry's standard variables, and nothing else: ``OTEL_TRACES_EXPORTER`` (``otlp``,
``console``, ``none``), ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``
(``http/protobuf``, the default, or ``grpc``), ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER`` / ``_ARG`` and the batch processor's ``OTEL_BSP_*``.

Off unless an exporter or an OTLP endpoint is named: then the SDK is not even imported, and the request path only
reads one ``None``."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from services.gateway.tracing.spans import Tracing

log = logging.getLogger(__name__)
ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_SERVICE = "switchyard"


class TracingError(ValueError):
    """The tracing variables name something this gateway cannot do: it does not start."""


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the variables ask for traces: an exporter other than ``none``, or an OTLP endpoint (exporter
    ``otlp`` by default then), and the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(environ.get(name, "").strip() for name in ENDPOINTS)


def tracing_from_environment(environ: Mapping[str, str], *, detail: str = "stages") -> Tracing | None:
    """The gateway's ``Tracing`` as the variables configure it, ``None`` when they ask for none."""
    if not tracing_wanted(environ):
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    resource = Resource.create({} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER / _ARG
    if not isinstance(provider.sampler, ParentBased):
        # A caller's sampled parent is always recorded: a client that asked for a trace gets one, whatever ratio
        # the gateway samples its own roots at.
        provider = TracerProvider(resource=resource, sampler=ParentBased(root=provider.sampler))
    # The traces a recorded request links to (its shadow call) are recorded too: a provider that samples every span,
    # exporting through the same processors.
    recording = TracerProvider(resource=resource, sampler=ALWAYS_ON)
    exporters = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    for name in exporters:
        processor = BatchSpanProcessor(_exporter(name, environ))
        provider.add_span_processor(processor)
        recording.add_span_processor(processor)
    tracer = provider.get_tracer("switchyard.gateway")
    log.info(
        "tracing on: exporter %s, sampler %s, service %s, detail %s",
        ", ".join(exporters), provider.sampler.get_description(), resource.attributes.get(SERVICE_NAME), detail,
    )
    return Tracing(
        tracer, detail=detail, shutdown=provider.shutdown, recording=recording.get_tracer("switchyard.gateway")
    )


def _exporter(name: str, environ: Mapping[str, str]):  # type: ignore[no-untyped-def]
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingError(f"OTEL_TRACES_EXPORTER names {name!r}; this gateway exports with otlp or console (or none)")
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or PROTOCOLS[0]
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    raise TracingError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL is {protocol!r}; expected one of {', '.join(PROTOCOLS)} (http/json is not "
        "exported by the Python SDK)"
    )
