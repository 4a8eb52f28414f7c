"""The generate extension through the app (scripted backend ``double``: x FP32 [-1, 4], y = 2x, z = -x): JSON keys to
inputs and outputs to keys, server-sent events, the admission step, errors before and after a stream starts, a
client that leaves mid-stream; the codec's shapes and the event writer on their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from scripted_backend import ScriptedBackend
from starlette.types import Message

from services.gateway.app import create_app
from services.gateway.errors import DeadlineExceeded, InvalidInput
from services.gateway.rest.generate import sse_events
from services.gateway.rest.generate_codec import fitted_shape
from services.gateway.settings import Settings
from services.gateway.tensors.types import InferOutput, InferRequest, InferResponse

ANSWER = {"model_name": "double", "model_version": "1", "y": [2.0, 4.0, 6.0, 8.0], "z": [-1.0, -2.0, -3.0, -4.0]}


def _requests(registry: CollectorRegistry, code: str, model: str = "double", version: str = "1") -> float:
    labels = {"model": model, "version": version, "protocol": "http", "code": code}
    return registry.get_sample_value("switchyard_requests_total", labels) or 0.0


def _events(text: str) -> list[Any]:
    """The JSON of each ``data:`` event, checking the framing on the way."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(event.startswith("data: ") for event in events)
    return [orjson.loads(event[len("data: ") :]) for event in events]


async def test_generate_answers_outputs_by_name_when_input_given_as_list(
    client: httpx.AsyncClient, registry: CollectorRegistry
) -> None:
    answer = await client.post("/v2/models/double/generate", json={"x": [1, 2, 3, 4]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["x-model-version"] == "1"
    assert answer.json() == ANSWER
    pinned = await client.post("/v2/models/double/versions/1/generate", json={"x": [[1, 2], [3, 4]]})  # nesting too
    assert pinned.json() == ANSWER
    assert _requests(registry, "200") == 2  # counted as inference


async def test_generate_stream_sends_one_event_when_model_answers_once(
    client: httpx.AsyncClient, registry: CollectorRegistry
) -> None:
    answer = await client.post("/v2/models/double/generate_stream", json={"x": [1, 2, 3, 4]})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert _events(answer.text) == [ANSWER]
    assert registry.get_sample_value("switchyard_open_streams", {"protocol": "http"}) == 0


async def test_generate_refuses_with_v2_error_when_a_field_does_not_fit(
    client: httpx.AsyncClient, registry: CollectorRegistry
) -> None:
    for path in ("generate", "generate_stream"):  # before the stream starts: the usual answer, as JSON
        short = await client.post(f"/v2/models/double/{path}", json={"x": [1, 2, 3]})
        assert short.status_code == 400
        assert short.headers["content-type"] == "application/json"
        assert short.json() == {
            "error": "input 'x': 3 value(s) do not fit the shape [-1, 4] the model declares; it takes a multiple of 4 "
            "values"
        }
    text = await client.post("/v2/models/double/generate", json={"x": ["a", 1, 2, 3]})
    assert text.json() == {"error": 'input \'x\': FP32 data must be numbers (or "NaN", "Infinity", "-Infinity"), '
                           'got the string "a" at index 0'}
    missing = await client.post("/v2/models/double/generate", json={})
    assert missing.status_code == 400
    assert "'x'" in missing.json()["error"]
    extra = await client.post("/v2/models/double/generate", json={"x": [1, 2, 3, 4], "temperature": 0.5})
    assert extra.status_code == 400  # no backend here passes request parameters to a model
    assert "parameter 'temperature' is not supported for model 'double'" in extra.json()["error"]
    twice = await client.post("/v2/models/double/generate", json={"x": [1] * 4, "k": 1, "parameters": {"k": 2}})
    assert twice.json() == {"error": "parameter 'k' is given twice: as a key of the body and in 'parameters'"}
    listed = await client.post("/v2/models/double/generate", json=[1, 2])
    assert listed.json()["error"].startswith("the generate request body must be a JSON object")
    unknown = await client.post("/v2/models/nope/generate", json={"x": [1]})
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "Request for unknown model: 'nope' is not found"}
    # Counted like a refused /infer: by the version once the data plane routed it (missing input, parameter).
    assert (_requests(registry, "400", version=""), _requests(registry, "400")) == (5, 2)
    assert registry.get_sample_value("switchyard_rejected_total", {"model": "double", "reason": "invalid"}) == 7


async def test_generate_takes_admission_step_when_keys_limits_and_deadlines_apply(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    changed = settings.model_copy(update={"api_keys": SecretStr("k-alpha-123:alpha")})
    app = create_app(changed, backend=backend, registry=registry)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            keyless = await http.post("/v2/models/double/generate_stream", json={"x": [1, 2, 3, 4]})
            key = {"X-API-Key": "k-alpha-123"}
            large = await http.post("/v2/models/double/generate", headers=key, content=b"{" + b" " * 5000 + b"}")
            backend.delay_s, backend.calls[:] = 0.5, []
            # 100 ms: long enough to reach the backend on a loaded machine (a 1 ms budget could expire before it).
            late = await http.post("/v2/models/double/generate", headers=key,
                                   json={"x": [1, 2, 3, 4], "parameters": {"timeout": 100_000}})
    assert keyless.status_code == 401
    assert large.status_code == 413
    assert large.json()["error"] == "request body of 5002 bytes exceeds the 4096 byte limit"
    assert late.status_code == 504, late.text
    [(_, budget, _)] = backend.calls
    assert budget is not None
    assert budget <= 0.1  # the body's deadline (100 ms) reached the backend
    tenants = {code: registry.get_sample_value("switchyard_tenant_requests_total", {"tenant": tenant, "code": code})
               for tenant, code in (("anonymous", "401"), ("anonymous", "413"), ("alpha", "504"))}
    assert tenants == {"401": 1, "413": 1, "504": 1}  # the size is checked before the key, as on /infer


async def test_generate_stream_closes_data_plane_stream_when_client_leaves(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    app = create_app(settings, backend=backend, registry=registry)
    dataplane = app.state.dataplane
    closed = asyncio.Event()
    never = asyncio.Event()

    async def endless(request: InferRequest, *, protocol: str, header: Any = None) -> AsyncIterator[InferResponse]:
        """A decoupled model that answers once and then takes forever (the decoupled backend stands in here)."""
        try:
            yield InferResponse("double", 1, [InferOutput("y", "FP32", np.ones(4, np.float32))], final=False)
            await never.wait()
        finally:
            closed.set()

    dataplane.infer_stream = endless
    sent: list[Message] = []
    gone = asyncio.Event()
    body = orjson.dumps({"x": [1, 2, 3, 4]})

    bodies = [body]

    async def receive() -> Message:
        if bodies:
            return {"type": "http.request", "body": bodies.pop(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message.get("body"):
            gone.set()  # the first event arrived: the client leaves

    path = "/v2/models/double/generate_stream"
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "server": ("gateway", 80),
             "client": ("client", 1)}
    async with LifespanManager(app):
        await asyncio.wait_for(app(scope, receive, send), timeout=10)
        assert closed.is_set()
    assert [m["type"] for m in sent[:2]] == ["http.response.start", "http.response.body"]
    assert _events(sent[1]["body"].decode()) == [{"model_name": "double", "model_version": "1", "y": [1.0] * 4}]
    assert registry.get_sample_value("switchyard_open_streams", {"protocol": "http"}) == 0


async def test_sse_events_writes_each_response_then_error_when_stream_fails_midway() -> None:
    def response(step: int, final: bool = False, outputs: bool = True) -> InferResponse:
        data = [InferOutput("text", "BYTES", np.array([f"token {step}".encode()], dtype=object))] if outputs else []
        return InferResponse("llm", 3, data, final=final)

    async def rest() -> AsyncIterator[InferResponse]:
        yield response(1)
        yield response(2)
        yield response(3, final=True, outputs=False)  # the closing flag: no event

    async def failing() -> AsyncIterator[InferResponse]:
        yield response(1)
        raise DeadlineExceeded("request to model 'llm' ran past its deadline")

    written = b"".join([event async for event in sse_events(response(0), rest(), "test")])
    assert _events(written.decode()) == [
        {"model_name": "llm", "model_version": "3", "text": f"token {step}"} for step in range(3)
    ]
    broken = b"".join([event async for event in sse_events(response(0), failing(), "test")])
    assert _events(broken.decode())[2:] == [{"error": "request to model 'llm' ran past its deadline"}]
    assert len(_events(broken.decode())) == 3


@pytest.mark.parametrize(
    ("declared", "count", "shape"),
    [([-1, 4], 8, (2, 4)), ([-1, -1], 5, (1, 5)), ([3], 3, (3,)), ([-1, 2, -1], 6, (1, 2, 3)), ([-1], 1, (1,))],
)
def test_fitted_shape_spreads_values_like_triton_when_dims_allow(
    declared: list[int], count: int, shape: tuple[int, ...]
) -> None:
    assert fitted_shape(declared, count, "x") == shape


def test_fitted_shape_refuses_naming_what_fits_when_values_do_not() -> None:
    with pytest.raises(InvalidInput, match=r"input 'x': 4 value\(s\) do not fit the shape \[3\] .* exactly 3 values"):
        fitted_shape([3], 4, "x")
    with pytest.raises(InvalidInput, match="a multiple of 4"):
        fitted_shape([-1, 4], 6, "x")


async def test_generate_refuses_several_responses_when_not_streamed(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings
) -> None:
    app = create_app(settings, backend=backend, registry=registry)

    async def twice(request: InferRequest, *, protocol: str, header: Any = None) -> AsyncIterator[InferResponse]:
        for final in (False, True):
            yield InferResponse("double", 1, [InferOutput("y", "FP32", np.ones(4, np.float32))], final=final)

    app.state.dataplane.infer_stream = twice
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            one = await http.post("/v2/models/double/generate", json={"x": [1, 2, 3, 4]})
            streamed = await http.post("/v2/models/double/generate_stream", json={"x": [1, 2, 3, 4]})
    assert one.status_code == 400
    assert one.json() == {"error": "model 'double' sent 2 responses to the request; generate answers with exactly "
                          "one: ask generate_stream, which sends each as an event"}
    assert _events(streamed.text) == [{"model_name": "double", "model_version": "1", "y": [1.0] * 4}] * 2
