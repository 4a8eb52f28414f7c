"""The bounds of a ``ModelStreamInfer`` stream, over the scripted backend: no more requests read than may be served
at once, an idle stream ended, and a gateway shutdown that delivers the answers in flight before it ends the stream.
The stream's context is a stand-in: what is under test is when the gateway reads, answers and ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend
from tritonclient.grpc import service_pb2

from services.gateway.app import create_app
from services.gateway.grpc_api.stream import StreamService, _Exchange
from services.gateway.settings import Settings
from tests.waiting import wait_until_async


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class Call:
    """What the stream reads of its grpc.aio context."""

    def time_remaining(self) -> float | None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def request(index: int) -> Any:
    message = service_pb2.ModelInferRequest(model_name="double", id=str(index))
    message.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    message.raw_input_contents.append(np.full((1, 4), index, np.float32).tobytes())
    return message


class Sender:
    """The client's side of the stream: ``count`` requests, counting how many the gateway has read; ``close``
    half-closes it (else it stays open after the last one)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.read = 0
        self.close = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[Any]:
        for index in range(self.count):
            self.read += 1
            yield request(index)
        await self.close.wait()


@pytest.fixture
async def app_parts(settings: Settings) -> AsyncIterator[tuple[Any, ScriptedBackend]]:
    backend = ScriptedBackend()
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app):
        backend.calls.clear()  # the startup warm-up's requests
        yield app.state.dataplane, backend


async def collect(answers: AsyncIterator[Any], into: list[Any]) -> None:
    async for answer in answers:
        into.append(answer)


async def test_a_stream_reads_no_more_requests_than_it_may_serve_at_once(
    app_parts: tuple[Any, ScriptedBackend],
) -> None:
    dataplane, backend = app_parts
    backend.hold = asyncio.Event()
    streams = StreamService(dataplane, max_inflight=2, idle_timeout_s=0)
    sender = Sender(5)
    got: list[Any] = []
    served = asyncio.create_task(collect(streams.serve(sender.__aiter__(), Call(), lambda name: None,
                                                       (None, None, None)), got))
    assert await wait_until_async(lambda: len(backend.calls) == 2)
    for _ in range(50):  # loop turns, not wall time: a reader that did not wait for a slot would read on in these
        await asyncio.sleep(0)
    assert (sender.read, len(backend.calls), got) == (2, 2, [])
    backend.hold.set()
    assert await wait_until_async(lambda: len(got) == 5)
    sender.close.set()
    await asyncio.wait_for(served, 5)
    assert sorted(answer.infer_response.id for answer in got) == ["0", "1", "2", "3", "4"]
    assert all(answer.infer_response.parameters["triton_final_response"].bool_param for answer in got)


async def test_an_idle_stream_ends_with_deadline_exceeded_once_its_requests_are_answered(
    app_parts: tuple[Any, ScriptedBackend],
) -> None:
    dataplane, _ = app_parts
    streams = StreamService(dataplane, max_inflight=4, idle_timeout_s=0.2)
    got: list[Any] = []
    with pytest.raises(Aborted) as aborted:
        await asyncio.wait_for(collect(streams.serve(Sender(3).__aiter__(), Call(), lambda name: None,
                                                     (None, None, None)), got), 5)
    assert aborted.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert str(aborted.value) == ("stream idle for 0.2 s (SWITCHYARD_STREAM_IDLE_TIMEOUT_S): no request in flight and "
                                  "none arriving")
    assert len(got) == 3


class AbortingCall(Call):
    """As grpc.aio does: once the call is aborted, a read still waiting for the next request raises AbortError."""

    def __init__(self) -> None:
        self.aborted = asyncio.Event()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.set()
        await asyncio.sleep(0)  # the waiting read is failed before the abort reaches the caller
        raise Aborted(code, details)


class SenderOfAbortedCall(Sender):
    def __init__(self, count: int, call: AbortingCall) -> None:
        super().__init__(count)
        self.call = call

    async def __aiter__(self) -> AsyncIterator[Any]:
        for index in range(self.count):
            yield request(index)
        await self.call.aborted.wait()
        raise grpc.aio.AbortError("Locally aborted.")


async def test_an_idle_stream_that_ended_is_no_longer_counted_as_open(app_parts: tuple[Any, ScriptedBackend]) -> None:
    dataplane, _ = app_parts
    streams = StreamService(dataplane, max_inflight=4, idle_timeout_s=0.1)
    registry = dataplane.metrics.registry

    for _ in range(2):
        call = AbortingCall()
        with pytest.raises(Aborted):
            await asyncio.wait_for(collect(streams.serve(SenderOfAbortedCall(2, call).__aiter__(), call,
                                                         lambda name: None, (None, None, None)), []), 5)

    assert registry.get_sample_value("switchyard_open_streams", {"protocol": "grpc"}) == 0


async def test_shutdown_delivers_the_answers_in_flight_then_ends_the_stream_unavailable(
    app_parts: tuple[Any, ScriptedBackend],
) -> None:
    dataplane, backend = app_parts
    backend.hold = asyncio.Event()
    streams = StreamService(dataplane, max_inflight=8, idle_timeout_s=0)
    sender = Sender(3)
    got: list[Any] = []
    served = asyncio.create_task(collect(streams.serve(sender.__aiter__(), Call(), lambda name: None,
                                                       (None, None, None)), got))
    assert await wait_until_async(lambda: len(backend.calls) == 3)
    streams.close()
    backend.hold.set()
    with pytest.raises(Aborted) as aborted:
        await asyncio.wait_for(served, 5)
    assert aborted.value.code is grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in str(aborted.value)
    assert sorted(answer.infer_response.id for answer in got) == ["0", "1", "2"]
    with pytest.raises(Aborted):  # a stream opened now is refused at once
        await collect(streams.serve(Sender(1).__aiter__(), Call(), lambda name: None, (None, None, None)), [])


async def test_answers_wait_for_room_when_the_client_stops_reading() -> None:
    """Twice the stream's in-flight limit of answers may wait unread; a request's next answer then waits for the
    writer to take one, and a waiting request that is cancelled (its client went away) leaves the others waiting."""
    exchange = _Exchange(max_inflight=2)
    for index in range(4):
        await exchange.put(index)
    fifth = asyncio.create_task(exchange.put(4))
    sixth = asyncio.create_task(exchange.put(5))
    for _ in range(20):
        await asyncio.sleep(0)
    assert (fifth.done(), sixth.done()) == (False, False)
    sixth.cancel()
    assert exchange.take() == 0
    await asyncio.wait_for(fifth, 1)
    assert list(exchange.answers) == [1, 2, 3, 4]
    assert sixth.cancelled()


async def test_a_request_answered_with_no_response_does_not_count_as_the_stream_timing_out() -> None:
    """A decoupled model may answer a request with no response at all. The writer, waiting on an idle stream, is
    woken when that request finishes and finds no answer: that wake is not its idle timeout, which has not passed."""
    exchange = _Exchange(max_inflight=2)
    writer = asyncio.create_task(exchange.wait(30))
    await asyncio.sleep(0)
    exchange.inflight += 1  # the reader takes a request in...
    exchange.finished()  # ...and its task ends without queueing an answer
    assert await asyncio.wait_for(writer, 1) is True


async def test_streams_past_the_open_limit_are_refused_until_one_ends(app_parts: tuple[Any, ScriptedBackend]) -> None:
    dataplane, _ = app_parts
    streams = StreamService(dataplane, max_inflight=4, idle_timeout_s=0, max_open=2)
    senders = [Sender(1), Sender(1)]
    got: list[Any] = []
    held = [asyncio.create_task(collect(streams.serve(sender.__aiter__(), Call(), lambda name: None,
                                                      (None, None, None)), got)) for sender in senders]
    assert await wait_until_async(lambda: len(got) == 2)  # both open, each answered, neither ended
    with pytest.raises(Aborted) as refused:
        await collect(streams.serve(Sender(1).__aiter__(), Call(), lambda name: None, (None, None, None)), got)
    assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(refused.value) == (
        "2 ModelStreamInfer streams are open, the gateway's limit (SWITCHYARD_STREAM_MAX_OPEN): send on a stream you "
        "have open, or retry once one has ended"
    )
    senders[0].close.set()  # the client half-closes one: the next stream is taken
    await asyncio.wait_for(held[0], 5)
    third = Sender(1)
    third.close.set()
    await asyncio.wait_for(collect(streams.serve(third.__aiter__(), Call(), lambda name: None, (None, None, None)),
                                   got), 5)
    assert len(got) == 3
    senders[1].close.set()
    await asyncio.wait_for(held[1], 5)
