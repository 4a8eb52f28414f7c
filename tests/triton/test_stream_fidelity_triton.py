"""Streaming as Triton 2.51 streams, side by side: the same requests of the decoupled ``countdown`` sent to the
session's local Triton directly and through the gateway in front of it, over HTTP's generate extension and gRPC's
``ModelStreamInfer``; what a client written against Triton reads must read the same (docs/protocol.md, "Generate"
and "Streaming inference (gRPC)")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.tritonlocal import LocalTriton
from tests.decoupled_models import MODEL, countdown_gateway
from tests.gateway_harness import RunningGateway

pytestmark = pytest.mark.slow  # a local Triton and a gateway on real ports

EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"


@pytest.fixture(scope="module")
def fidelity_gateway(triton: LocalTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with countdown_gateway(triton, tmp_path_factory.mktemp("fidelity")) as running:
        yield running


def urls(triton: LocalTriton, gateway: RunningGateway, kind: str) -> dict[str, str]:
    if kind == "http":
        return {"triton": triton.http_url, "gateway": gateway.http_url}
    return {"triton": triton.grpc_url, "gateway": gateway.grpc_url}


def countdown(count: int, request_id: str, **parameters: bool | int | str) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=MODEL, id=request_id)
    message.inputs.add(name="N", datatype="INT32", shape=[1])  # its values in raw_input_contents, as tritonclient
    message.raw_input_contents.append(np.array([count], np.int32).tobytes())
    for name, value in parameters.items():
        if isinstance(value, bool):
            message.parameters[name].bool_param = value
        elif isinstance(value, int):
            message.parameters[name].int64_param = value
        else:
            message.parameters[name].string_param = value
    return message


def streamed(url: str, requests: list[service_pb2.ModelInferRequest]) -> dict[str, list[tuple[Any, ...]]]:
    """Every message of one stream carrying ``requests`` (half-closed once sent), by request id, each as what a client
    reads: (error or not, the model named, the final flag or None, the outputs' names)."""
    by_id: dict[str, list[tuple[Any, ...]]] = {}
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for message in stub.ModelStreamInfer(iter(requests), timeout=30):
            answer = message.infer_response
            final = answer.parameters[FINAL].bool_param if FINAL in answer.parameters else None
            by_id.setdefault(answer.id, []).append(
                (bool(message.error_message), answer.model_name, final, tuple(out.name for out in answer.outputs))
            )
    return by_id


def error_texts(url: str, request: service_pb2.ModelInferRequest) -> list[str]:
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return [message.error_message for message in stub.ModelStreamInfer(iter([request]), timeout=30)]


def events(url: str, body: dict[str, Any], route: str = "generate_stream") -> tuple[int, list[Any]]:
    answer = httpx.post(f"http://{url}/v2/models/{MODEL}/{route}", json=body, timeout=30)
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8", answer.text
    assert answer.text == "" or answer.text.endswith("\n\n")
    found = [json.loads(line.removeprefix("data: ")) for line in answer.text.split("\n\n") if line]
    return answer.status_code, found


RESPONSE = (False, MODEL, False, ("INDEX", "COUNT"))
CLOSING = (False, MODEL, True, ())


def test_stream_sends_the_final_flag_alone_only_to_a_client_that_asks_for_it_as_triton_does(
    triton: LocalTriton, fidelity_gateway: RunningGateway
) -> None:
    """Without ``triton_enable_empty_final_response`` Triton sends the model's responses only: an empty one more is
    a result without outputs to a tritonclient callback, and ``as_numpy`` gives None."""
    requests = [countdown(2, "two"), countdown(0, "none"), countdown(1, "asked", **{EMPTY_FINAL: True}),
                countdown(0, "asked-none", **{EMPTY_FINAL: True})]
    got = {name: streamed(url, requests) for name, url in urls(triton, fidelity_gateway, "grpc").items()}
    assert got["gateway"] == got["triton"]
    assert got["gateway"] == {"two": [RESPONSE, RESPONSE], "asked": [RESPONSE, CLOSING], "asked-none": [CLOSING]}


def test_stream_answers_a_model_failure_with_tritons_fields_and_the_final_response_after_it(
    triton: LocalTriton, fidelity_gateway: RunningGateway
) -> None:
    requests = [countdown(3, "asked", fail_at=1, **{EMPTY_FINAL: True}), countdown(3, "first", fail_at=0)]
    got = {name: streamed(url, requests) for name, url in urls(triton, fidelity_gateway, "grpc").items()}
    failed = (True, MODEL, False, ())
    assert got["triton"]["asked"] == got["gateway"]["asked"] == [RESPONSE, failed, CLOSING]
    # Without the empty final response asked for, Triton marks the error not final and sends nothing more; the gateway
    # ends the request at the error, and says so.
    assert got["triton"]["first"] == [failed]
    assert got["gateway"]["first"] == [(True, MODEL, True, ())]


def test_stream_refuses_an_empty_final_flag_that_is_not_a_bool_in_tritons_words(
    triton: LocalTriton, fidelity_gateway: RunningGateway
) -> None:
    words = f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param"
    for value in ("yes", 1):
        request = countdown(1, "typed", **{EMPTY_FINAL: value})
        texts = {name: error_texts(url, request) for name, url in urls(triton, fidelity_gateway, "grpc").items()}
        assert [text.startswith(words) for text in texts["triton"]] == [True]
        assert len(texts["gateway"]) == 1
        assert texts["gateway"][0] == f"{words}; got the {'string' if value == 'yes' else 'integer'} {value!r}"


def test_generate_stream_sends_no_event_when_a_decoupled_model_answers_nothing(
    triton: LocalTriton, fidelity_gateway: RunningGateway
) -> None:
    got = {name: events(url, {"N": 0}) for name, url in urls(triton, fidelity_gateway, "http").items()}
    assert got["gateway"] == got["triton"] == (200, [])


def test_generate_refuses_a_decoupled_request_that_answered_nothing(
    triton: LocalTriton, fidelity_gateway: RunningGateway
) -> None:
    """Triton answers 200 with an error object; the gateway 400 (docs/protocol.md): never an answer without outputs."""
    direct = httpx.post(f"http://{triton.http_url}/v2/models/{MODEL}/generate", json={"N": 0}, timeout=30)
    assert "exactly 1 response" in direct.json()["error"]
    answer = httpx.post(f"http://{fidelity_gateway.http_url}/v2/models/{MODEL}/generate", json={"N": 0}, timeout=30)
    assert answer.status_code == 400
    assert answer.json() == {"error": f"model '{MODEL}' sent 0 responses to the request; generate answers with exactly "
                             "one: ask generate_stream, which sends each as an event"}


def test_generate_stream_echoes_the_request_id_in_every_event_as_triton_does(
    triton: LocalTriton, fidelity_gateway: RunningGateway
) -> None:
    body = {"N": 2, "id": "tokens-7"}
    got = {name: events(url, body) for name, url in urls(triton, fidelity_gateway, "http").items()}
    assert got["gateway"] == got["triton"]
    status, sent = got["gateway"]
    assert status == 200
    assert sent == [{"model_name": MODEL, "model_version": "1", "id": "tokens-7", "INDEX": index, "COUNT": 2}
                    for index in range(2)]
