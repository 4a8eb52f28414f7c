"""An OpenTelemetry collector stand-in for tests: an OTLP/HTTP receiver on a free loopback port that keeps every
span it is sent, so that a test can assert on what a real exporter (the gateway's SDK, Triton's C++ exporter) put
on the wire. No collector binary exists on this machine, and a fake exporter would prove nothing about the real
one's encoding, so the receiver decodes the real payload (``ExportTraceServiceRequest``) as a collector does: in
protobuf (``application/x-protobuf``: the Python SDK) or in OTLP/JSON (``application/json``: Triton 2.51's C++
exporter sends only that), gzip or not.

    with otlp_receiver() as receiver:
        start_something(env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        spans = receiver.wait_for(lambda spans: any(s.name == "infer" for s in spans), timeout_s=10)

Only traces are received: ``/v1/metrics`` and ``/v1/logs`` answer 404, so a test notices an exporter it did not
mean to turn on. A payload the receiver cannot read answers 400 and is kept in ``errors`` (an exporter retries or
drops it, and the test would otherwise only see spans missing)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 64 * 1024 * 1024
SpanCheck = Callable[[list["ReceivedSpan"]], bool]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver got it, with ids as lowercase hex (the form a ``traceparent`` header carries)."""

    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer
    attributes: dict[str, Any] = field(hash=False)
    start_ns: int
    end_ns: int
    service: str  # the resource's service.name, "" when the exporter sent none
    links: list[tuple[str, str]] = field(hash=False)  # (trace_id, span_id) of each linked span
    status_code: int  # opentelemetry.proto.trace.v1.Status.StatusCode: 0 unset, 1 ok, 2 error
    events: list[tuple[str, int]] = field(hash=False, default_factory=list)  # (name, time_ns): Triton's timestamps
    scope: str = ""  # the instrumentation scope's name


class OtlpReceiver:
    """What ``otlp_receiver()`` yields: the endpoint to configure and the spans received so far."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.exports = 0  # export requests decoded, empty ones included
        self.errors: list[str] = []  # why each refused request was refused
        self.payloads: list[str] = []  # every export request decoded, whole, in protobuf text format

    @property
    def endpoint(self) -> str:
        """The base URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes it (exporters append ``/v1/traces``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def traces_url(self) -> str:
        """The full URL, as ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` and Triton's ``opentelemetry,url=`` take it."""
        return self.endpoint + TRACES_PATH

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in arrival order."""
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        """Forget what was received, so that the next assertion sees only what follows."""
        with self._lock:
            self._spans.clear()
            self.errors.clear()
            self.payloads.clear()
            self.exports = 0

    def wait_for(self, predicate: SpanCheck, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        """The spans as soon as ``predicate(spans)`` holds. Exporters send in batches on their own schedule, so a
        test polls rather than sleeps. Raises AssertionError naming what did arrive when it still does not hold
        after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() >= deadline:
                raise AssertionError(self._timeout_message(spans, timeout_s))
            time.sleep(0.01)

    async def wait_for_async(self, predicate: SpanCheck, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        """``wait_for`` for a test whose exporter runs on the same event loop (an in-process gateway): it yields
        the loop between polls instead of blocking it."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() >= deadline:
                raise AssertionError(self._timeout_message(spans, timeout_s))
            await asyncio.sleep(0.01)

    def _timeout_message(self, spans: list[ReceivedSpan], timeout_s: float) -> str:
        names = [f"{span.service}/{span.name} trace={span.trace_id} parent={span.parent_span_id or '-'}"
                 for span in spans[-20:]]
        return (f"the OTLP receiver at {self.endpoint} did not get the expected spans within {timeout_s} s; "
                f"it got {len(spans)} span(s) in {self.exports} export(s), the last ones: {names}; "
                f"refused requests: {self.errors}")

    def _accept(self, request: ExportTraceServiceRequest) -> None:
        received = list(_spans_of(request))
        with self._lock:
            self._spans.extend(received)
            self.payloads.append(str(request))
            self.exports += 1

    def _refuse(self, reason: str) -> None:
        with self._lock:
            self.errors.append(reason)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver listening on 127.0.0.1 and a free port, served from a daemon thread until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ExportHandler)
    server.daemon_threads = True
    receiver = OtlpReceiver(server)
    server.receiver = receiver  # type: ignore[attr-defined]  # how the handler reaches it
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _ExportHandler(BaseHTTPRequestHandler):
    # HTTP/1.0: every connection closes after its answer, so no handler thread is left waiting on an idle
    # keep-alive connection when the receiver stops.
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        receiver: OtlpReceiver = self.server.receiver  # type: ignore[attr-defined]
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self._answer(404, f"only {TRACES_PATH} is received here, not {self.path}".encode(), "text/plain")
            return
        try:
            request = self._read_export()
        except ValueError as error:
            receiver._refuse(str(error))
            self._answer(400, str(error).encode(), "text/plain")
            return
        receiver._accept(request)
        self._answer(200, ExportTraceServiceResponse().SerializeToString(), PROTOBUF)

    def _read_export(self) -> ExportTraceServiceRequest:
        content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if content_type not in (PROTOBUF, JSON):
            raise ValueError(f"Content-Type {content_type or '(none)'!r} is not read here; "
                             f"expected {PROTOBUF!r} or {JSON!r}")
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_BODY_BYTES:
            raise ValueError(f"Content-Length {length} is out of range; expected 0 to {MAX_BODY_BYTES}")
        body = _decoded(self.rfile.read(length), self.headers.get("Content-Encoding", "identity"))
        return _from_json(body) if content_type == JSON else _from_protobuf(body)

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a test's output should show its own failures, not one access log line per export."""


def _decoded(body: bytes, encoding: str) -> bytes:
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    if coding != "gzip":
        raise ValueError(f"Content-Encoding {encoding!r} is not read here; expected gzip or none")
    try:
        return gzip.decompress(body)
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"the body is not valid gzip: {error}") from error


def _from_protobuf(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as error:
        raise ValueError(f"the body is not an ExportTraceServiceRequest in protobuf: {error}") from error
    return request


def _from_json(body: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON is protobuf's JSON mapping except that trace and span ids are hex, not base64 (the OTLP
    specification's one exception), so the ids are turned back into base64 before protobuf reads the rest."""
    try:
        document = json.loads(body)
        for resource_spans in document.get("resourceSpans", []):
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    _hex_ids_to_base64(span, ("traceId", "spanId", "parentSpanId"))
                    for link in span.get("links", []):
                        _hex_ids_to_base64(link, ("traceId", "spanId"))
        return ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (ValueError, AttributeError, TypeError, ParseError) as error:
        raise ValueError(f"the body is not an ExportTraceServiceRequest in OTLP/JSON: {error}") from error


def _hex_ids_to_base64(item: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if item.get(key):
            try:
                item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()
            except (ValueError, TypeError, binascii.Error) as error:
                raise ValueError(f"{key} {item[key]!r} is not hex, as OTLP/JSON writes ids") from error


def _spans_of(request: ExportTraceServiceRequest) -> Iterator[ReceivedSpan]:
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield _received(span, service, scope_spans.scope.name)


def _received(span: Span, service: str, scope: str) -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        name=span.name,
        kind=span.kind,
        attributes=_attributes(span.attributes),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        service=service,
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        status_code=span.status.code,
        events=[(event.name, event.time_unix_nano) for event in span.events],
        scope=scope,
    )


def _attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    """The attribute's value as plain Python: str, bool, int, float, bytes, a list or a dict (OTLP's AnyValue)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)
