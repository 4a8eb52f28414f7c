"""A decoupled model (``countdown``: N responses for input N) through the gateway on the Triton backend, served by the
session's local Triton: every response in order, the final flag, errors between responses, a version switch while a
request streams, and the refusal of a unary request. The dataplane is called on the gateway's own loop; the gRPC
``ModelStreamInfer`` front end is tested on top of it elsewhere."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError
from services.gateway.tensors.types import InferRequest, InferResponse
from services.gateway.versions.loading import load_version
from services.tritonlocal import LocalTriton
from tests.decoupled_models import MODEL, collect, countdown_gateway, countdown_request, counted
from tests.gateway_harness import RunningGateway
from tests.otlp_receiver import OtlpReceiver, otlp_receiver
from tests.waiting import wait_until_async

pytestmark = pytest.mark.slow  # a local Triton and a gateway on real ports

FIRST = "switchyard_time_to_first_response_seconds_count"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def decoupled_gateway(
    triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[RunningGateway]:
    """Traced, for the requests that come with a sampled ``traceparent`` (only one test sends one)."""
    environment = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    with mock.patch.dict(os.environ, environment), countdown_gateway(
        triton, tmp_path_factory.mktemp("decoupled")
    ) as running:
        yield running


def dataplane(gateway: RunningGateway) -> DataPlane:
    plane: DataPlane = gateway.app.state.dataplane
    return plane


async def until_error(plane: DataPlane, request: InferRequest) -> tuple[list[InferResponse], GatewayError | None]:
    """The responses that came before the request failed, and its error (``None``: it did not fail)."""
    responses: list[InferResponse] = []
    try:
        async for response in plane.infer_stream(request, protocol="grpc"):
            responses.append(response)
    except GatewayError as exc:
        return responses, exc
    return responses, None


async def test_infer_stream_gives_every_response_in_order_when_the_model_is_decoupled(
    decoupled_gateway: RunningGateway,
) -> None:
    gateway, plane = decoupled_gateway, dataplane(decoupled_gateway)
    ok = {"model": MODEL, "version": "1", "protocol": "grpc", "code": "200"}
    served_before = gateway.metric("switchyard_requests_total", **ok)
    responses = await gateway.on_loop(collect(plane, countdown_request(3)))
    assert counted(responses) == [(0, 3, False), (1, 3, False), (2, 3, False), (-1, -1, True)]
    assert [(r.id, r.version) for r in responses] == [("countdown-3", 1)] * 4
    assert responses[-1].outputs == []  # the model sent the final flag on its own, after its last answer
    nothing = await gateway.on_loop(collect(plane, countdown_request(0)))
    assert counted(nothing) == [(-1, -1, True)]  # N = 0: only the empty final response
    assert gateway.metric("switchyard_requests_total", **ok) == served_before + 2  # one per request, not response
    assert gateway.metric("switchyard_stream_responses_sum", model=MODEL) >= 4 + 1
    assert gateway.metric(FIRST, model=MODEL, version="1") >= 2
    assert plane.leases.count(MODEL, 1) == 0


async def test_infer_stream_raises_the_error_after_the_responses_before_it_when_the_model_fails_midway(
    decoupled_gateway: RunningGateway,
) -> None:
    gateway, plane = decoupled_gateway, dataplane(decoupled_gateway)
    failed = {"model": MODEL, "version": "1", "protocol": "grpc", "code": "500"}
    failed_before = gateway.metric("switchyard_requests_total", **failed)
    responses, error = await gateway.on_loop(until_error(plane, countdown_request(4, fail_at=2)))
    assert counted(responses) == [(0, 4, False), (1, 4, False)]
    assert error is not None
    assert error.status == 500
    # As for any model failure: the model's words go to the gateway log, the client gets the id to find them by.
    assert f"request id {error.request_id}" in str(error)
    assert gateway.metric("switchyard_requests_total", **failed) == failed_before + 1
    assert plane.leases.count(MODEL, 1) == 0
    after = await gateway.on_loop(collect(plane, countdown_request(1)))  # the model and its stream serve on
    assert counted(after) == [(0, 1, False), (-1, -1, True)]


async def test_infer_stream_releases_its_lease_and_slot_when_closed_before_the_final_response(
    decoupled_gateway: RunningGateway,
) -> None:
    gateway, plane = decoupled_gateway, dataplane(decoupled_gateway)

    async def first_then_close() -> tuple[InferResponse, int]:
        responses = plane.infer_stream(countdown_request(3, delay_ms=50), protocol="grpc")
        first = await anext(responses)
        held = plane.leases.count(MODEL, first.version)
        await responses.aclose()  # the client went away
        return first, held

    first, held = await gateway.on_loop(first_then_close())
    assert (counted([first]), held) == ([(0, 3, False)], 1)
    assert plane.leases.count(MODEL, first.version) == 0
    after = await gateway.on_loop(collect(plane, countdown_request(1)))  # Triton serves the model on
    assert counted(after) == [(0, 1, False), (-1, -1, True)]


async def test_unary_infer_gets_tritons_refusal_when_the_model_is_decoupled(decoupled_gateway: RunningGateway) -> None:
    body = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [2]}]}
    async with httpx.AsyncClient(base_url=f"http://{decoupled_gateway.http_url}", trust_env=False) as client:
        answer = await client.post(f"/v2/models/{MODEL}/infer", json=body)
    assert answer.status_code == 501
    error = answer.json()["error"]
    assert error.startswith("ModelInfer RPC doesn't support models with decoupled transaction policy")
    assert "ModelStreamInfer" in error  # and the gateway says what to use instead


async def test_warm_up_of_a_decoupled_model_streams_its_requests(decoupled_gateway: RunningGateway) -> None:
    """Triton refuses a decoupled model's request as a unary call: the warm-up must stream it, or every version of such
    a model serves with a failed warm-up noted (and counted) against it."""
    manager = decoupled_gateway.app.state.manager
    assert manager.notes.get(MODEL, 1) is None  # the startup's warm-up
    assert decoupled_gateway.metric("switchyard_invented_warmup_failures_total", model=MODEL) == 0


async def test_version_switch_waits_for_every_response_when_a_request_streams_across_it(
    decoupled_gateway: RunningGateway,
) -> None:
    """Last in the module: it leaves version 2 serving."""
    gateway, plane = decoupled_gateway, dataplane(decoupled_gateway)
    manager = gateway.app.state.manager
    await gateway.on_loop(load_version(manager, MODEL, 2))  # loaded beforehand: the switch is flip, drain, unload
    assert manager.notes.get(MODEL, 2) is None  # warmed up by streaming its requests
    firsts = gateway.metric(FIRST, model=MODEL, version="1")

    async def streamed() -> tuple[list[InferResponse], float]:
        return await collect(plane, countdown_request(5, delay_ms=60)), time.monotonic()

    async def switched() -> tuple[Any, float]:
        report = await manager.activate(MODEL, 2, compare=False)
        return report, time.monotonic()

    stream = asyncio.create_task(gateway.on_loop(streamed()))
    try:
        assert await wait_until_async(lambda: gateway.metric(FIRST, model=MODEL, version="1") > firsts)
        assert plane.leases.count(MODEL, 1) == 1  # the stream holds version 1 between its responses
        report, switched_at = await gateway.on_loop(switched())
    finally:
        responses, streamed_at = await stream
    assert counted(responses) == [(i, 5, False) for i in range(5)] + [(-1, -1, True)]  # none lost
    assert {r.version for r in responses} == {1}  # served to the end by the version it was routed to
    assert (report.result, report.drained, report.in_flight_left) == ("ok", True, 0)
    assert switched_at >= streamed_at  # the drain waited for the final response
    after = await gateway.on_loop(collect(plane, countdown_request(1)))
    assert {r.version for r in after} == {2}


def test_tritonclient_stream_gets_every_response_of_a_decoupled_model_in_order_with_the_final_flag(
    decoupled_gateway: RunningGateway,
) -> None:
    """The stream end to end: tritonclient, unchanged, asks for the empty final responses as it would of Triton."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled_gateway.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for count, request_id in ((3, "three"), (0, "none"), (2, "two")):
            n = grpcclient.InferInput("N", [1], "INT32")
            n.set_data_from_numpy(np.array([count], dtype=np.int32))
            client.async_stream_infer(MODEL, [n], request_id=request_id, enable_empty_final_response=True)
        bad = grpcclient.InferInput("N", [2], "INT32")  # the wrong shape: its error, and the stream goes on
        bad.set_data_from_numpy(np.array([1, 1], dtype=np.int32))
        client.async_stream_infer(MODEL, [bad], request_id="bad", enable_empty_final_response=True)
        by_id: dict[str, list[tuple[int, bool]]] = {}
        errors = []
        while sum(1 for got in by_id.values() if got and got[-1][1]) < 3 or not errors:
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(str(error))
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            index = result.as_numpy("INDEX")
            by_id.setdefault(response.id, []).append((-1 if index is None else int(index[0]), final))
        client.stop_stream()
    assert by_id == {"three": [(0, False), (1, False), (2, False), (-1, True)], "none": [(-1, True)],
                     "two": [(0, False), (1, False), (-1, True)]}
    assert len(errors) == 1, errors
    assert "unexpected shape for input 'N'" in errors[0]


def test_unary_grpc_infer_on_a_decoupled_model_is_unimplemented_with_tritons_words(
    decoupled_gateway: RunningGateway,
) -> None:
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([2], dtype=np.int32))
    with grpcclient.InferenceServerClient(decoupled_gateway.grpc_url) as client, pytest.raises(
        InferenceServerException
    ) as raised:
        client.infer(MODEL, [n])
    assert raised.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in raised.value.message()


def test_generate_stream_sends_one_server_sent_event_per_response_of_a_decoupled_model(
    decoupled_gateway: RunningGateway,
) -> None:
    url = f"http://{decoupled_gateway.http_url}/v2/models/{MODEL}/generate_stream"
    with httpx.stream("POST", url, json={"N": 3}, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line.removeprefix("data: ")) for line in answer.iter_lines() if line.startswith("data: ")]
    assert [(event["INDEX"], event["COUNT"]) for event in events] == [(0, 3), (1, 3), (2, 3)]
    assert len({(event["model_name"], event["model_version"]) for event in events}) == 1  # one request, one version
    assert events[0]["model_name"] == MODEL
    many = httpx.post(f"http://{decoupled_gateway.http_url}/v2/models/{MODEL}/generate", json={"N": 2}, timeout=30)
    assert many.status_code == 400, many.text


def test_generate_stream_span_of_a_decoupled_request_names_its_version_and_route(
    decoupled_gateway: RunningGateway, receiver: OtlpReceiver
) -> None:
    """As a unary request's span does: which version answered, and how the request reached it."""
    trace_id = "7df92f3577b34da6a3ce929d0e0e4736"
    url = f"http://{decoupled_gateway.http_url}/v2/models/{MODEL}/generate_stream"
    parent = f"00-{trace_id}-00f067aa0ba902b7-01"
    with httpx.stream("POST", url, json={"N": 2}, headers={"traceparent": parent}, timeout=30) as answer:
        assert answer.status_code == 200
        events = [json.loads(line.removeprefix("data: ")) for line in answer.iter_lines() if line.startswith("data: ")]
    assert len(events) == 2
    name = "POST /v2/models/{model_name}/generate_stream"
    spans = receiver.wait_for(lambda got: any(s.trace_id == trace_id and s.name == name for s in got))
    server = next(s for s in spans if s.trace_id == trace_id and s.name == name)
    assert server.attributes["switchyard.model"] == MODEL
    # The stable version, which a test before this one may have switched: the one that answered.
    assert server.attributes["switchyard.version"] == int(events[0]["model_version"])
    assert server.attributes["switchyard.route"] == "stable"
