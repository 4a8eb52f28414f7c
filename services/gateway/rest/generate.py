"""The generate extension's routes: ``POST /v2/models/{m}[/versions/{v}]/generate`` (one JSON answer) and
``.../generate_stream`` (server-sent events, one ``data:`` event per response), on every model.

A request takes the admission step ``/infer`` takes (``Shaper.admit`` / ``Shaper.shape``, counted alike, with the
same errors: docs/architecture.md, "Admission"); ``generate_codec`` maps its JSON to the model's inputs with the
metadata of the version it is routed to. Until a stream's first response, a failure is the ordinary v2 error answer
with its status; after it, as in Triton, an event ``data: {"error": "..."}`` and the end of the stream (the status,
200, is sent). A client that goes away ends the stream: the data plane's stream is closed, and with it its lease.

With tracing on, each request has a server span (``TracedGenerateEndpoint``) and its answer the span's
``traceparent``; the inference log leaves these routes out (docs/observability.md, "The inference log")."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from services.gateway.dataplane import DataPlane
from services.gateway.errors import ClientGone, GatewayError, InvalidInput, unexpected
from services.gateway.rest.body import declared_length, read_body, read_inflated_body
from services.gateway.rest.compression import encode_answer, inflater_for
from services.gateway.rest.generate_codec import decode_generate, encode_generate, error_json
from services.gateway.rest.responses import gateway_error_response
from services.gateway.shaping.shaper import Admitted
from services.gateway.tensors.types import InferRequest, InferResponse
from services.gateway.tracing.observe import unlogged
from services.gateway.tracing.spans import CURRENT, Tracing
from services.gateway.versions.numbers import parse_version

__all__ = ["GenerateEndpoint", "TracedGenerateEndpoint", "generate_routes", "sse_events"]

PROTOCOL = "http"
EVENT_STREAM = "text/event-stream"
log = logging.getLogger(__name__)


def generate_routes(dataplane: DataPlane, *, max_body_bytes: int, tracing: Tracing | None = None) -> list[Route]:
    """The four routes (``generate``, ``generate_stream``, each unversioned and versioned), POST only; traced when
    ``tracing`` is given."""
    routes = []
    for suffix, streaming in (("generate", False), ("generate_stream", True)):
        endpoint = (
            GenerateEndpoint(dataplane, max_body_bytes=max_body_bytes, streaming=streaming) if tracing is None
            else TracedGenerateEndpoint(dataplane, max_body_bytes=max_body_bytes, streaming=streaming, tracing=tracing)
        )
        for base in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
            routes.append(Route(f"{base}/{suffix}", endpoint, methods=["POST"]))
    return routes


class GenerateEndpoint:
    """One of the two routes as a bare ASGI endpoint: it answers every failure itself, so that none reaches the
    server (which would drop the keep-alive connection) and every request is counted."""

    def __init__(self, dataplane: DataPlane, *, max_body_bytes: int, streaming: bool) -> None:
        self._dataplane = dataplane
        self._max_body = max_body_bytes
        self._streaming = streaming

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model: str = scope["path_params"]["model_name"]
        raw_version: str | None = scope["path_params"].get("model_version")
        headers = Headers(scope=scope)
        admitted = Admitted()
        try:
            request = await self._request(receive, headers, admitted, model, raw_version)
        except GatewayError as exc:
            self._dataplane.record_error(model, raw_version, PROTOCOL, exc, admitted.tenant)
            await gateway_error_response(exc)(scope, receive, send)
            return
        except ClientDisconnect:  # not our failure: counted, and nothing to answer
            gone = ClientGone("the client went away before its request body arrived")
            self._dataplane.record_error(model, raw_version, PROTOCOL, gone, admitted.tenant)
            return
        except Exception as exc:
            error = unexpected(exc, f"{scope['method']} {scope['path']}")
            self._dataplane.record_error(model, raw_version, PROTOCOL, error, admitted.tenant)
            await gateway_error_response(error)(scope, receive, send)
            return
        # Counted by the data plane from here on, as every inference request; not logged (``unlogged``): a log record
        # is one v2 request and its one answer, and a generate request is neither (docs/observability.md).
        stream = self._dataplane.infer_stream(request, protocol=PROTOCOL, header=unlogged(headers.get))
        answer = self._stream if self._streaming else self._answer
        try:
            response = await answer(stream, headers, admitted, scope)
            await response(scope, receive, send)
        finally:
            await _close(stream)  # ends the data plane's stream wherever it stopped: its lease goes with it

    async def _request(
        self, receive: Receive, headers: Headers, admitted: Admitted, model: str, raw_version: str | None
    ) -> InferRequest:
        """The admission step's checks before decoding, the body, the request it stands for, then the checks after."""
        started = time.monotonic()
        shaper = self._dataplane.shaper
        size = declared_length(headers.get("content-length"))
        await shaper.admit(admitted, model, PROTOCOL, api_key=headers.get("x-api-key"), size=size)
        version = None if raw_version is None else parse_version(raw_version)
        coded = headers.get("content-encoding")
        inflater = None if coded is None else inflater_for(coded.encode("latin-1"), self._max_body)
        if inflater is None:
            body = await read_body(receive, self._max_body)
        else:
            body = await read_inflated_body(receive, self._max_body, inflater)
        metadata = await self._dataplane.model_metadata(model, version)  # which keys are inputs, and their dims
        request = decode_generate(body, model, version, metadata)
        shaper.shape(request, admitted, started, timeout=headers.get("x-request-timeout"),
                     priority=headers.get("x-priority"))
        return request

    async def _answer(
        self, stream: AsyncIterator[InferResponse], headers: Headers, admitted: Admitted, scope: Scope
    ) -> Response:
        """``generate``: the one response, as JSON. A model that sends several is read to its end (its lease and
        slot are freed as usual) and refused: only ``generate_stream`` can carry them."""
        answered: InferResponse | None = None
        count = 0
        try:
            async for response in stream:
                if _closing_flag(response):
                    continue  # not an answer: alone, the model answered nothing (Triton refuses that too)
                answered = answered or response
                count += 1
        except GatewayError as exc:  # counted by the data plane
            return gateway_error_response(exc)
        if answered is None or count != 1:
            return gateway_error_response(InvalidInput(
                f"model '{scope['path_params']['model_name']}' sent {count} responses to the request; generate "
                "answers with exactly one: ask generate_stream, which sends each as an event"
            ))
        try:
            content = encode_generate(answered)
            extra: tuple[tuple[bytes, bytes], ...] = ()
            accept = headers.get("accept-encoding")
            if accept is not None:
                content, extra = encode_answer(content, accept.encode("latin-1"))
        except GatewayError as exc:  # an output JSON cannot carry; the request itself was counted
            return gateway_error_response(exc)
        except Exception as exc:
            return self._unexpected(exc, scope, admitted)
        json = Response(content, media_type="application/json", headers=_head(answered.version, admitted))
        json.raw_headers.extend(extra)
        return json

    async def _stream(
        self, stream: AsyncIterator[InferResponse], headers: Headers, admitted: Admitted, scope: Scope
    ) -> Response:
        """``generate_stream``: the first response decides the status (an error before it is the usual answer),
        then each response is an event as it comes."""
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            first = None
        except GatewayError as exc:  # counted by the data plane
            return gateway_error_response(exc)
        except Exception as exc:
            return self._unexpected(exc, scope, admitted)
        version = first.version if first is not None else None
        return _EventStream(
            sse_events(first, stream, f"{scope['method']} {scope['path']}"),
            self._dataplane,
            headers=_head(version, admitted),
        )

    def _unexpected(self, exc: Exception, scope: Scope, admitted: Admitted) -> Response:
        """A bug on the way out: a counted 500 naming the request id its traceback is logged under."""
        error = unexpected(exc, f"{scope['method']} {scope['path']}")
        params = scope["path_params"]
        self._dataplane.record_error(params["model_name"], params.get("model_version"), PROTOCOL, error,
                                     admitted.tenant)
        return gateway_error_response(error)


class TracedGenerateEndpoint(GenerateEndpoint):
    """The route with a server span per request, named like the route (``POST /v2/models/{model_name}/generate``,
    ``.../generate_stream``, versioned or not, as ``/infer``'s): the caller's ``traceparent`` is its parent, the
    answer (a stream: its headers) carries the span's own, sampled or not. A stream's span ends with its last event."""

    def __init__(self, dataplane: DataPlane, *, max_body_bytes: int, streaming: bool, tracing: Tracing) -> None:
        super().__init__(dataplane, max_body_bytes=max_body_bytes, streaming=streaming)
        self._tracing = tracing
        self._span_name = f"POST /v2/models/{{model_name}}/{'generate_stream' if streaming else 'generate'}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        attributes = {
            "switchyard.model": scope["path_params"]["model_name"], "switchyard.protocol": PROTOCOL,
            "url.path": scope["path"],
        }
        trace = self._tracing.server(self._span_name, headers.get, attributes)
        traceparent = (b"traceparent", trace.traceparent.encode("latin-1"))
        sent: list[int] = []

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent.append(message["status"])
                message = {**message, "headers": [*message.get("headers", ()), traceparent]}
            await send(message)

        token = CURRENT.set(trace)  # the data plane's stream, and the task that sends the events, inherit it
        try:
            await super().__call__(scope, receive, traced_send)
        finally:
            CURRENT.reset(token)
            # A failure the data plane or this route counted set the span's status; a stream's sent status (200)
            # would hide one that came after the first event.
            trace.end(sent[0] if sent and trace.status == 200 else None)


async def sse_events(
    first: InferResponse | None, rest: AsyncIterator[InferResponse], where: str
) -> AsyncIterator[bytes]:
    """Each response as one server-sent event, ``first`` then ``rest`` to their end; a failure on the way becomes an
    event holding the v2 error object, and the last. A decoupled model's closing flag (a final response without
    outputs) is no event, as in Triton: it carries nothing, and a model that answers nothing sends no event at all."""
    try:
        if first is not None and not _closing_flag(first):
            yield _event(encode_generate(first))
        async for response in rest:
            if not _closing_flag(response):
                yield _event(encode_generate(response))
    except GatewayError as exc:  # counted by the data plane, or an output JSON cannot carry
        yield _event(error_json(str(exc)))
    except Exception as exc:  # a bug: the error names the request id its traceback is logged under
        yield _event(error_json(str(unexpected(exc, where))))


class _EventStream(StreamingResponse):
    """The events, with the stream counted open (``switchyard_open_streams``) while they are sent. Starlette ends
    sending when the client goes away; whatever way it ends, the events' generator is closed here, so that the data
    plane's stream under it is closed at once, not when the garbage collector finds it."""

    def __init__(self, events: AsyncIterator[bytes], dataplane: DataPlane, *, headers: dict[str, str]) -> None:
        super().__init__(events, media_type=EVENT_STREAM, headers={**headers, "cache-control": "no-cache"})
        self._events = events
        self._open = dataplane.metrics.open_streams.labels(PROTOCOL)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._open.inc()
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._open.dec()
            await _close(self._events)


async def _close(stream: AsyncIterator[object]) -> None:
    """Close an async generator now (its ``finally`` runs); a plain iterator has nothing to close."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


def _closing_flag(response: InferResponse) -> bool:
    """A decoupled model's final flag sent on its own (Triton's empty final response): the end, not an answer."""
    return response.final and not response.outputs


def _event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def _head(version: int | None, admitted: Admitted) -> dict[str, str]:
    """The answer's headers: the version that served it and, with rate limiting on, the caller's figures."""
    head = dict(admitted.limits)
    if version is not None:
        head["x-model-version"] = str(version)
    return head
