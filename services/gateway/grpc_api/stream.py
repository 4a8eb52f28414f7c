"""``ModelStreamInfer``: many inference requests on one bidirectional gRPC stream, answered in order of completion.

Each request on the stream goes the way a unary ``ModelInfer`` goes (admission, routing, lease, batching, counting):
the call's metadata (API key, timeout, priority) and deadline apply to every request on it. A request that fails is
answered on the stream with its ``error_message`` and its id, as Triton answers it (a model's failure names the model
and carries the final flag too); the stream goes on. Every successful response carries ``triton_final_response``
(false on all but the last of a decoupled model's responses); a decoupled model's final flag on its own goes to the
client, as an empty response, only when its request asked with ``triton_enable_empty_final_response``, as in Triton
(docs/protocol.md, "Streaming inference (gRPC)").

Bounds: at most ``max_inflight`` requests of one stream are served at once; past that the stream is not read until
one is answered, so a fast sender is held back by gRPC's flow control instead of queueing without bound. Answers wait
in a short queue for the client to read them; a client that stops reading stops the stream's requests too. A stream
with nothing in flight and nothing arriving for ``idle_timeout_s`` ends with ``DEADLINE_EXCEEDED``; at most
``max_open`` streams are open at once (each holds some memory, idle or not), more are refused with
``RESOURCE_EXHAUSTED``. When the gateway shuts down, open streams stop reading, deliver what is in flight, and end
with ``UNAVAILABLE`` (the client knows to reconnect); a stream the client had half-closed ends with OK as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError, InferenceFailed, InvalidInput, shown, unexpected
from services.gateway.grpc_api.cancelled import count_cancelled
from services.gateway.grpc_api.codec import decode_request, encode_response
from services.gateway.shaping.shaper import Admitted
from services.gateway.tensors.regions import tensor_regions
from services.gateway.tensors.types import InferRequest, InferResponse
from services.gateway.tracing.spans import CURRENT, Tracing
from services.gateway.versions.routing import Header

PROTOCOL = "grpc"
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
SPAN_NAME = "inference.GRPCInferenceService/ModelStreamInfer"


class _Exchange:
    """One stream's requests in flight and answers waiting to be written, and the two tasks that wait on them: the
    reader (for a free slot) and the writer (for an answer, or the stream's end). A request costs a few list and
    counter operations here, where asyncio's Queue and Semaphore would each cost a loop lookup and a waiter deque.

    The requests in flight are counted, not read off their tasks: a task's last answer is queued before the task
    object is done, and the writer must not wait for an answer no one will send."""

    __slots__ = ("answers", "inflight", "reading", "_max_inflight", "_room", "_reader", "_writer", "_senders")

    def __init__(self, max_inflight: int) -> None:
        self.answers: deque[Any] = deque()
        self.inflight = 0
        self.reading = True
        self._max_inflight = max_inflight
        self._room = 2 * max_inflight
        """Answers that may wait for the client to read them: past it a request's next answer waits (a decoupled
        model's many responses, held back by a client that stops reading)."""
        self._reader: asyncio.Future[None] | None = None
        self._writer: asyncio.Future[object] | None = None
        self._senders: asyncio.Future[None] | None = None

    async def slot(self) -> None:
        """Return once another request may be served: the next one is read only then (backpressure)."""
        while self.inflight >= self._max_inflight:
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader

    def finished(self) -> None:
        """A request's answers are all queued."""
        self.inflight -= 1
        _wake(self._reader)
        if not self.inflight:  # a writer waiting on no answers may now end the stream (or time it out)
            _wake(self._writer)

    def stopped_reading(self) -> None:
        self.reading = False
        _wake(self._writer)

    async def put(self, answer: Any) -> None:
        while len(self.answers) >= self._room:
            if self._senders is None or self._senders.done():
                self._senders = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._senders)  # shared by every waiting sender: one cancelled must not end it
        self.answers.append(answer)
        _wake(self._writer)

    def take(self) -> Any:
        """The next answer to write (``None``: none waits)."""
        if not self.answers:
            return None
        answer = self.answers.popleft()
        _wake(self._senders)
        return answer

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait for an answer or a change in the stream's state; False when ``timeout_s`` passed first with nothing
        to do. A wake with nothing to write is not a timeout: a request a decoupled model answered with no response
        at all wakes the writer when it finishes, and the stream is then as idle as before, not idle for long."""
        loop = asyncio.get_running_loop()
        waiter = self._writer = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            self._writer = None
            if timer is not None:
                timer.cancel()
        return waiter.result() is not _EXPIRED or bool(self.answers) or self.inflight > 0 or not self.reading


_EXPIRED = object()
"""What an idle writer's wait is woken with when its timeout passed."""


def _expire(waiter: asyncio.Future[object]) -> None:
    if not waiter.done():
        waiter.set_result(_EXPIRED)


def _wake(waiter: asyncio.Future[Any] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class StreamService:
    """Serves every open ``ModelStreamInfer`` call of one gRPC server."""

    def __init__(
        self, dataplane: DataPlane, *, max_inflight: int, idle_timeout_s: float, max_open: int = 1024
    ) -> None:
        self._dataplane = dataplane
        self._max_inflight = max_inflight
        self._idle_timeout_s = idle_timeout_s
        self._max_open = max_open
        self._closing = asyncio.Event()
        self._open: set[asyncio.Task[None]] = set()
        """The reader task of every open stream: cancelled at shutdown, so that no stream takes new requests."""

    def _tracing(self) -> Tracing | None:
        observer = self._dataplane.observer
        return None if observer is None else observer.tracing

    @property
    def stopping(self) -> bool:
        """The gRPC server is shutting down (``close`` was called)."""
        return self._closing.is_set()

    def close(self) -> None:
        """Shutdown: every stream stops reading new requests, answers those in flight, then ends."""
        self._closing.set()
        for reader in list(self._open):
            reader.cancel()

    async def serve(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any], header: Header,
        admission: tuple[str | None, str | None, str | None],
    ) -> AsyncIterator[Any]:
        """The stream's answers as they are ready. ``header`` reads the call's metadata (a sticky canary split);
        ``admission`` is its API key, timeout and priority, read once for the whole stream."""
        if self._closing.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the gateway is shutting down: open the stream elsewhere")
        if len(self._open) >= self._max_open:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{len(self._open)} ModelStreamInfer streams are open, the gateway's limit "
                "(SWITCHYARD_STREAM_MAX_OPEN): send on a stream you have open, or retry once one has ended",
            )
        exchange = _Exchange(self._max_inflight)
        serving: set[asyncio.Task[None]] = set()
        half_closed = False

        def serve_one(request: Any) -> Coroutine[Any, Any, None]:
            tracing = self._tracing()
            if tracing is None:
                return self._serve(request, context, header, admission, exchange)
            return self._traced(tracing, request, context, header, admission, exchange)

        async def read() -> None:
            nonlocal half_closed
            try:
                stream = aiter(requests)
                while True:
                    await exchange.slot()
                    try:
                        request = await anext(stream)
                    except StopAsyncIteration:
                        half_closed = True
                        return
                    exchange.inflight += 1
                    task = asyncio.create_task(serve_one(request))
                    serving.add(task)
                    task.add_done_callback(serving.discard)
            finally:
                exchange.stopped_reading()

        metrics = self._dataplane.metrics.open_streams.labels(PROTOCOL)
        metrics.inc()
        reader = asyncio.create_task(read())
        self._open.add(reader)
        idle_timeout_s = self._idle_timeout_s
        try:
            while True:
                answer = exchange.take()
                if answer is not None:
                    yield answer
                    continue
                if not exchange.reading and not exchange.inflight:
                    break
                idle = not exchange.inflight and idle_timeout_s > 0
                if not await exchange.wait(idle_timeout_s if idle else None):
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"stream idle for {idle_timeout_s:g} s (SWITCHYARD_STREAM_IDLE_TIMEOUT_S): no request "
                        "in flight and none arriving",
                    )
            if self._closing.is_set() and not half_closed:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    "the gateway is shutting down: the stream's requests in flight were answered; open a new stream",
                )
        finally:
            metrics.dec()  # first: nothing below may keep an ended stream counted as open
            self._open.discard(reader)
            reader.cancel()
            for task in list(serving):  # the client went away (or the call ended): its requests are not wanted
                task.cancel()
            # A call this generator aborted (idle, shutdown) ends the reader's wait for the next request with grpc's
            # AbortError rather than a cancellation: either way the stream is over.
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AbortError):
                await reader

    async def _traced(
        self, tracing: Tracing, request: Any, context: grpc.aio.ServicerContext[Any, Any], header: Header,
        admission: tuple[str | None, str | None, str | None], exchange: _Exchange,
    ) -> None:
        """``_serve`` in a server span of its own (in its own task: its own current trace)."""
        trace = tracing.server(SPAN_NAME, header, {"switchyard.model": request.model_name,
                                                   "switchyard.protocol": PROTOCOL})
        CURRENT.set(trace)
        try:
            await self._serve(request, context, header, admission, exchange)
        finally:
            trace.end()

    async def _serve(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], header: Header,
        admission: tuple[str | None, str | None, str | None], exchange: _Exchange,
    ) -> None:
        """A request's task: put its answers on the stream, its responses or one error response naming it. One
        coroutine for the request's own steps (each level of awaiting costs on every suspension and resumption)."""
        admitted = Admitted()
        decoded: InferRequest | None = None
        try:
            started = time.monotonic()
            dataplane = self._dataplane
            shaper = dataplane.shaper
            api_key, timeout, priority = admission
            try:
                await shaper.admit(admitted, request.model_name, PROTOCOL, api_key=api_key, size=request.ByteSize())
                decoded = decode_request(request, tensor_regions(dataplane.regions, admitted.tenant))
                empty_final = _empty_final_asked(decoded)
                shaper.shape(decoded, admitted, started, timeout=timeout, priority=priority,
                             call_remaining_s=context.time_remaining())
            except GatewayError as exc:
                dataplane.record_error(request.model_name, request.model_version, PROTOCOL, exc, admitted.tenant)
                await exchange.put(_error(request.id, exc))
                return
            except Exception as exc:
                error = unexpected(exc, "a request on a gRPC stream")
                dataplane.record_error(request.model_name, request.model_version, PROTOCOL, error, admitted.tenant)
                await exchange.put(_error(request.id, error))
                return
            decoupled = dataplane.decoupled(decoded.model)
            try:
                if not decoupled:  # the common case, without a generator per request
                    response = await dataplane.infer_once_streamed(decoded, protocol=PROTOCOL, header=header)
                    await exchange.put(_answer(response))
                    return
                # aclosing: a cancelled request (the client went away) ends its responses and releases its lease at
                # once, not whenever the abandoned generator is collected.
                responses = dataplane.infer_stream(decoded, protocol=PROTOCOL, header=header)
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        if response.final and not response.outputs and not empty_final:
                            continue  # the final flag on its own: Triton sends it only to a client that asks
                        await exchange.put(_answer(response))
            except GatewayError as exc:  # counted by the dataplane
                if isinstance(exc, InferenceFailed):
                    await _model_failed(request.id, decoded.model, exc, decoupled and empty_final, exchange)
                else:
                    await exchange.put(_error(request.id, exc))
            except Exception as exc:
                error = unexpected(exc, "a request on a gRPC stream")
                dataplane.record_error(decoded.model, decoded.version, PROTOCOL, error, admitted.tenant)
                await exchange.put(_error(request.id, error))
        except asyncio.CancelledError:  # the stream ended under it: its client went away, or its deadline passed
            version = request.model_version if decoded is None else decoded.counted_version()
            count_cancelled(self._dataplane, context, request.model_name, version, admitted.tenant,
                            stopping=self.stopping)
            raise
        finally:
            exchange.finished()


async def _model_failed(
    request_id: str, model: str, error: GatewayError, closing: bool, exchange: _Exchange
) -> None:
    """A model that failed once it had the request, in Triton's shape: the error names the model and carries the final
    flag. The request ends there: ``closing`` (a decoupled model's client that asked for the empty final response)
    sends that response after the error, as Triton does (tritonclient hands an error to its callback without its flag:
    a client that waits for the final flag would wait for ever)."""
    message = _error(request_id, error)
    message.infer_response.model_name = model
    message.infer_response.parameters[FINAL].bool_param = not closing
    await exchange.put(message)
    if closing:
        final = service_pb2.ModelStreamInferResponse()
        final.infer_response.model_name = model
        final.infer_response.id = request_id
        final.infer_response.parameters[FINAL].bool_param = True
        await exchange.put(final)


def _empty_final_asked(request: InferRequest) -> bool:
    """Whether the client asked for the final flag on its own (``triton_enable_empty_final_response``, a bool), taken
    out of the request's parameters: it is the stream's business, not the model's, on every backend and model."""
    value = request.parameters.get(EMPTY_FINAL, False)
    if EMPTY_FINAL in request.parameters:
        request.parameters = {name: kept for name, kept in request.parameters.items() if name != EMPTY_FINAL}
    if not isinstance(value, bool):
        raise InvalidInput(
            f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param; got {_kind(value)}"
        )
    return value


def _kind(value: object) -> str:
    """What came instead of a bool, as the client set it."""
    if isinstance(value, str):
        return f"the string {shown(value)}"
    return f"the {'integer' if isinstance(value, int) else 'number'} {value}"


def _answer(response: InferResponse) -> Any:
    message = service_pb2.ModelStreamInferResponse()
    encode_response(response, into=message.infer_response)
    message.infer_response.parameters[FINAL].bool_param = response.final
    return message


def _error(request_id: str, error: GatewayError) -> Any:
    """Triton's shape of a failed request on a stream: the message, and the request's id to match it by."""
    message = service_pb2.ModelStreamInferResponse(error_message=str(error))
    message.infer_response.id = request_id
    return message
