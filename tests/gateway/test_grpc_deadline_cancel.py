"""A gRPC call that gRPC itself cancels at its deadline (which can come before the gateway's own timer for the same
instant) is counted as a deadline refusal; a call the client cancels is not. The cancellation is injected: it is
the fault under test, and its timing against the gateway's timer is not something a real call can choose."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend
from tritonclient.grpc import service_pb2

from services.gateway.app import create_app
from services.gateway.grpc_api.servicer import InferenceServicer
from services.gateway.grpc_api.stream import StreamService
from services.gateway.settings import Settings
from tests.waiting import wait_until_async


class _Call:
    """What the servicer reads of its grpc.aio context, with the deadline set by the test."""

    def __init__(self, remaining_s: float) -> None:
        self.remaining_s = remaining_s

    def time_remaining(self) -> float:
        return self.remaining_s

    def invocation_metadata(self) -> tuple[()]:
        return ()


async def _deadline_refusals_after_cancel(settings: Settings, remaining_at_cancel_s: float) -> float | None:
    registry = CollectorRegistry()
    backend = ScriptedBackend()
    app = create_app(settings, backend=backend, registry=registry)
    async with LifespanManager(app):
        backend.calls.clear()  # the startup warm-up's requests
        backend.delay_s = 30.0  # long past the call's end
        streams = StreamService(app.state.dataplane, max_inflight=1, idle_timeout_s=0)
        servicer = InferenceServicer(app.state.dataplane, repository=None, streams=streams)  # type: ignore[arg-type]
        request = service_pb2.ModelInferRequest(model_name="double")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
        call = _Call(remaining_s=10.0)  # the gateway's own timer is set for 10 s from now
        answer = asyncio.create_task(servicer.ModelInfer(request, call))
        assert await wait_until_async(lambda: bool(backend.calls), interval_s=0.001)  # the backend is running it
        call.remaining_s = remaining_at_cancel_s
        answer.cancel()  # what grpc.aio does to the handler's task when the call ends early
        with pytest.raises(asyncio.CancelledError):
            await answer
        return registry.get_sample_value("switchyard_rejected_total", {"model": "double", "reason": "deadline"})


async def test_grpc_call_cancelled_at_its_deadline_counts_as_a_deadline_refusal_when_grpc_ends_it_first(
    settings: Settings,
) -> None:
    assert await _deadline_refusals_after_cancel(settings, -0.001) == 1


async def test_grpc_call_cancelled_by_its_client_counts_no_deadline_refusal_when_time_remains(
    settings: Settings,
) -> None:
    assert not await _deadline_refusals_after_cancel(settings, 5.0)
