"""``ModelStreamInfer``: many inference requests on one bidirectional gRPC stream, answered in order of completion.

Each request on the stream goes the way a unary ``ModelInfer`` goes (admission, routing, lease, batching, counting):
the call's metadata (API key, timeout, priority) and deadline apply to every request on it. A request that fails is
answered on the stream with its ``error_message`` and its id, as Triton answers it; the stream goes on. Every
successful response carries ``triton_final_response`` (false on all but the last of a decoupled model's responses).

Bounds: at most ``max_inflight`` requests of one stream are served at once; past that the stream is not read until
one is answered, so a fast sender is held back by gRPC's flow control instead of queueing without bound. Answers wait
in a short queue for the client to read them; a client that stops reading stops the stream's requests too. A stream
with nothing in flight and nothing arriving for ``idle_timeout_s`` ends with ``DEADLINE_EXCEEDED``. When the gateway
shuts down, open streams stop reading, deliver what is in flight, and end with ``UNAVAILABLE`` (the client knows to
reconnect); a stream the client had half-closed ends with OK as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc
from tritonclient.grpc import service_pb2

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError, unexpected
from services.gateway.grpc_api.codec import decode_request, encode_response
from services.gateway.shaping.shaper import Admitted
from services.gateway.tensors.regions import tensor_regions
from services.gateway.tensors.types import InferResponse
from services.gateway.tracing.spans import CURRENT, Tracing
from services.gateway.versions.routing import Header

PROTOCOL = "grpc"
SPAN_NAME = "inference.GRPCInferenceService/ModelStreamInfer"
_TASK_DONE: Final = object()
"""Put on the answer queue when a request's last answer is in, ``_READER_DONE`` when the stream's requests are over:
wake-up calls for a writer waiting on an empty queue, which then checks whether the stream is over."""
_READER_DONE: Final = object()


class StreamService:
    """Serves every open ``ModelStreamInfer`` call of one gRPC server."""

    def __init__(self, dataplane: DataPlane, *, max_inflight: int, idle_timeout_s: float) -> None:
        self._dataplane = dataplane
        self._max_inflight = max_inflight
        self._idle_timeout_s = idle_timeout_s
        self._closing = asyncio.Event()
        self._open: set[asyncio.Task[None]] = set()
        """The reader task of every open stream: cancelled at shutdown, so that no stream takes new requests."""

    def _tracing(self) -> Tracing | None:
        observer = self._dataplane.observer
        return None if observer is None else observer.tracing

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
        answers: asyncio.Queue[object] = asyncio.Queue(maxsize=2 * self._max_inflight)
        slots = asyncio.Semaphore(self._max_inflight)
        serving: set[asyncio.Task[None]] = set()
        # Counted here, not read off the tasks: a task's last answer (and its _TASK_DONE) is queued before the task
        # object is done, and the writer must not wait for an answer that no one will send.
        inflight = 0
        reading = True
        half_closed = False

        async def serve_one(request: Any) -> None:
            nonlocal inflight
            try:
                tracing = self._tracing()
                if tracing is None:
                    await self._serve(request, context, header, admission, answers)
                else:  # each request of the stream its own server span (in its own task: its own current trace)
                    trace = tracing.server(SPAN_NAME, header, {"switchyard.model": request.model_name,
                                                               "switchyard.protocol": PROTOCOL})
                    CURRENT.set(trace)
                    try:
                        await self._serve(request, context, header, admission, answers)
                    finally:
                        trace.end()
            finally:
                inflight -= 1
                slots.release()
                # A wake-up call, needed only by a writer that may be waiting on an empty queue while this was the
                # last request in flight (its answer woke the writer before this count dropped: a decoupled request
                # closing its responses). Otherwise an answer in the queue, or another request's, wakes it.
                if not inflight and answers.empty():
                    answers.put_nowait(_TASK_DONE)

        async def read() -> None:
            nonlocal inflight, reading, half_closed
            try:
                stream = aiter(requests)
                while True:
                    await slots.acquire()  # backpressure: the next request is read only when a slot is free
                    try:
                        request = await anext(stream)
                    except StopAsyncIteration:
                        half_closed = True
                        return
                    inflight += 1
                    task = asyncio.create_task(serve_one(request))
                    serving.add(task)
                    task.add_done_callback(serving.discard)
            finally:
                reading = False
                with contextlib.suppress(asyncio.QueueFull):
                    answers.put_nowait(_READER_DONE)  # a wake-up call only: a full queue wakes the writer anyway

        metrics = self._dataplane.metrics.open_streams.labels(PROTOCOL)
        metrics.inc()
        reader = asyncio.create_task(read())
        self._open.add(reader)
        try:
            while reading or inflight or not answers.empty():
                idle = not inflight and self._idle_timeout_s > 0 and reading
                try:
                    async with asyncio.timeout(self._idle_timeout_s if idle else None):
                        answer = await answers.get()
                except TimeoutError:
                    if inflight or not answers.empty():
                        continue  # a request arrived as the timer fired
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"stream idle for {self._idle_timeout_s:g} s (SWITCHYARD_STREAM_IDLE_TIMEOUT_S): no request "
                        "in flight and none arriving",
                    )
                if answer is not _TASK_DONE and answer is not _READER_DONE:
                    yield answer
            if self._closing.is_set() and not half_closed:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    "the gateway is shutting down: the stream's requests in flight were answered; open a new stream",
                )
        finally:
            self._open.discard(reader)
            reader.cancel()
            for task in list(serving):  # the client went away (or the call ended): its requests are not wanted
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            metrics.dec()

    async def _serve(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any], header: Header,
        admission: tuple[str | None, str | None, str | None], answers: asyncio.Queue[object],
    ) -> None:
        """Put one request's answers on the stream's queue: its responses, or one error response naming it."""
        started = time.monotonic()
        dataplane = self._dataplane
        shaper = dataplane.shaper
        admitted = Admitted()
        api_key, timeout, priority = admission
        try:
            await shaper.admit(admitted, request.model_name, PROTOCOL, api_key=api_key, size=request.ByteSize())
            decoded = decode_request(request, tensor_regions(dataplane.regions, admitted.tenant))
            shaper.shape(decoded, admitted, started, timeout=timeout, priority=priority,
                         call_remaining_s=context.time_remaining())
        except GatewayError as exc:
            dataplane.record_error(request.model_name, request.model_version, PROTOCOL, exc, admitted.tenant)
            await answers.put(_error(request.id, exc))
            return
        except Exception as exc:
            error = unexpected(exc, "a request on a gRPC stream")
            dataplane.record_error(request.model_name, request.model_version, PROTOCOL, error, admitted.tenant)
            await answers.put(_error(request.id, error))
            return
        try:
            if not dataplane.decoupled(decoded.model):  # the common case, without a generator per request
                response = await dataplane.infer_once_streamed(decoded, protocol=PROTOCOL, header=header)
                await answers.put(_answer(response))
                return
            # aclosing: a cancelled request (the client went away) ends its responses and releases its lease at once,
            # not whenever the abandoned generator is collected.
            responses = dataplane.infer_stream(decoded, protocol=PROTOCOL, header=header)
            async with contextlib.aclosing(responses):
                async for response in responses:
                    await answers.put(_answer(response))
        except GatewayError as exc:  # counted by the dataplane
            await answers.put(_error(request.id, exc))
        except Exception as exc:
            error = unexpected(exc, "a request on a gRPC stream")
            dataplane.record_error(decoded.model, decoded.version, PROTOCOL, error, admitted.tenant)
            await answers.put(_error(request.id, error))


def _answer(response: InferResponse) -> Any:
    message = service_pb2.ModelStreamInferResponse()
    encode_response(response, into=message.infer_response)
    message.infer_response.parameters["triton_final_response"].bool_param = response.final
    return message


def _error(request_id: str, error: GatewayError) -> Any:
    """Triton's shape of a failed request on a stream: the message, and the request's id to match it by."""
    message = service_pb2.ModelStreamInferResponse(error_message=str(error))
    message.infer_response.id = request_id
    return message
