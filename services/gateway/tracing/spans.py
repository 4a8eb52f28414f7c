"""A request's trace: its server span, the children that say where its time went, the ``traceparent`` its answer
carries, and the context a call to Triton passes on.

The edges start a ``RequestTrace`` per inference (``Tracing.server``) and make it the task's current one
(``CURRENT``); the data plane and the backends add children with the times they measured anyway (``child``: start
and end given, the span made afterwards), so that no timer, context switch or span object stands on the request's
way while it runs. With ``SWITCHYARD_TRACE_DETAIL=request`` only the server span is recorded."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

CURRENT: ContextVar[RequestTrace | None] = ContextVar("switchyard_request_trace", default=None)
"""The trace of the request the running task serves (``None`` when tracing is off or outside a request)."""
DETAILS = ("stages", "request")
"""``stages``: the server span and a child per stage (admission wait, batch queue, execution, the call to Triton);
``request``: the server span only (one span per request)."""

Getter = Callable[[str], str | None]
"""Reads one header (gRPC: metadata) by its lower-case name."""


class _HeaderGetter:
    """The propagator's view of a request's headers: it asks for ``traceparent`` and ``tracestate`` only."""

    def get(self, carrier: Getter, key: str) -> list[str] | None:
        value = carrier(key)
        return None if value is None else [value]

    def keys(self, carrier: Getter) -> list[str]:
        return [key for key in ("traceparent", "tracestate") if carrier(key) is not None]


_GETTER = _HeaderGetter()


class Tracing:
    """The gateway's tracer (one per process, made by ``tracing.setup``) and how much of a request it records."""

    def __init__(
        self, tracer: Tracer, *, detail: str = "stages", shutdown: Callable[[], None] | None = None,
        recording: Tracer | None = None,
    ) -> None:
        """``recording``: a tracer that records every span it starts (same exporters), for the traces that must be
        recorded because another recorded one links to them; ``tracer`` when not given."""
        if detail not in DETAILS:
            raise ValueError(f"trace detail {detail!r} is not one of {', '.join(DETAILS)}")
        self.tracer = tracer
        self._recording = recording or tracer
        self.full = detail == "stages"
        self._propagator = TraceContextTextMapPropagator()
        self._shutdown = shutdown

    def server(self, name: str, headers: Getter, attributes: Mapping[str, Any]) -> RequestTrace:
        """The server span of one inference, child of the caller's ``traceparent`` when it sent one."""
        parent = self._propagator.extract(headers, getter=_GETTER)  # type: ignore[arg-type]
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        return RequestTrace(self, span)

    def linked(self, name: str, links: Sequence[RequestTrace], attributes: Mapping[str, Any]) -> RequestTrace:
        """A trace of its own, linked to the traces of ``links`` (a shadow call: not part of the answer's time),
        recorded whenever a linked one is (the sampler would otherwise decide for it as for any new root)."""
        context = trace.set_span_in_context(trace.INVALID_SPAN)  # a new root, whatever is current
        span_links = [Link(link.span.get_span_context()) for link in links]
        tracer = self._recording if any(link.sampled for link in links) else self.tracer
        span = tracer.start_span(name, context=context, kind=SpanKind.INTERNAL, links=span_links,
                                 attributes=attributes)
        return RequestTrace(self, span)

    def close(self) -> None:
        """Export what is still buffered (the gateway is stopping)."""
        if self._shutdown is not None:
            self._shutdown()


class RequestTrace:
    """One request's server span and what the request path records under it."""

    __slots__ = ("_offset_ns", "_tracing", "context", "reason", "sampled", "span", "span_id", "status", "trace_id")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self.span = span
        span_context = span.get_span_context()
        self.sampled = span_context.trace_flags.sampled
        self.trace_id = format(span_context.trace_id, "032x")
        self.span_id = format(span_context.span_id, "016x")
        self.status = 200
        """The answer's status (HTTP's code; gRPC's maps to it): set by the failure that ends the request, if any."""
        self.reason: str | None = None
        """Why the request was refused (``switchyard_rejected_total``'s reason), if it was."""
        self.context: Context = trace.set_span_in_context(span)
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        """Wall clock minus the monotonic clock the request path measures with (``time.monotonic`` and, on
        Linux, ``time.perf_counter`` read the same clock)."""

    @property
    def traceparent(self) -> str:
        """The W3C ``traceparent`` of the server span: what the answer carries, sampled or not."""
        span_context = self.span.get_span_context()
        flags = int(span_context.trace_flags)
        return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"

    @property
    def exemplar(self) -> dict[str, str] | None:
        """The exemplar labels a latency observation carries (only a recorded trace's id is worth a jump)."""
        return {"trace_id": self.trace_id} if self.sampled else None

    def set(self, attributes: Mapping[str, Any]) -> None:
        if self.sampled:
            self.span.set_attributes(attributes)

    def child(self, name: str, start: float, end: float, attributes: Mapping[str, Any] | None = None) -> None:
        """A finished child span from ``start`` to ``end`` (``time.monotonic()`` seconds)."""
        if not (self.sampled and self._tracing.full):
            return
        offset = self._offset_ns
        span = self._tracing.tracer.start_span(
            name, context=self.context, start_time=offset + int(start * 1e9), attributes=attributes
        )
        span.end(end_time=offset + int(end * 1e9))

    def batch(self, submitted: float, started: float, ended: float, rows: float) -> None:
        """The request's batch on the embedded backend: its wait in the queue (from its submit to the batch's start
        on a thread) and the batch's run (``time.monotonic()`` seconds)."""
        size = {"switchyard.batch_size": int(rows)}
        waited_ms = (started - submitted) * 1e3
        self.child("batch queue", submitted, started, {**size, "switchyard.queue_delay_ms": waited_ms})
        self.child("execute", started, ended, size)

    def client(self, name: str, attributes: Mapping[str, Any]) -> tuple[Span, dict[str, str]]:
        """A client span for a call to another server (Triton) and the headers that carry it there: the callee's
        own spans nest under it. The caller ends the span."""
        span = self._tracing.tracer.start_span(name, context=self.context, kind=SpanKind.CLIENT, attributes=attributes)
        headers: dict[str, str] = {}
        self._tracing._propagator.inject(headers, context=trace.set_span_in_context(span))
        return span, headers

    def end(self, status: int | None = None) -> None:
        """End the server span with the answer's status (``status`` when the edge saw it sent, else the one a failure
        set) and, for a refusal, why."""
        span = self.span
        status = self.status if status is None else status
        reason = self.reason
        if self.sampled:
            attributes: dict[str, Any] = {"switchyard.status": status, "switchyard.outcome": _outcome(status)}
            if reason is not None:
                attributes["switchyard.rejection"] = reason
            span.set_attributes(attributes)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, f"status {status}"))
        span.end()


def failed(span: Span, error: BaseException) -> None:
    """Mark a client span failed with what went wrong (its type and text: gateway errors hold no secrets)."""
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def _outcome(status: int) -> str:
    if status < 400:
        return "ok"
    return "rejected" if status < 500 or status in (503, 504) else "error"
