"""The inference routes as a bare ASGI handler, ahead of FastAPI: ``POST /v2/models/{m}[/versions/{v}]/infer``.

Every other route goes through FastAPI (docs, admin, health, metadata). Inference skips its middleware stack,
route table, ``Request`` and ``Response`` objects and their per-request wrappers: measured, those took more CPU per
request than decoding, validating, batching and running the model together. A request goes through the same checks
as on any route: the admission step (``Shaper.admit`` / ``Shaper.shape``) the gRPC servicer runs too, with the same
errors and counts (docs/architecture.md, "Admission"). The routes stay in FastAPI's table too (``LaneEndpoint``), so
other methods get 405 and the OpenAPI document lists them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping

from fastapi import FastAPI
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from services.gateway.dataplane import DataPlane
from services.gateway.errors import ClientGone, GatewayError, unexpected
from services.gateway.rest.answer_head import AnswerHeaders
from services.gateway.rest.body import declared_length, read_body, read_inflated_body
from services.gateway.rest.codec import decode_request, encode_response
from services.gateway.rest.compression import encode_answer, inflater_for
from services.gateway.rest.raw_request import RAW_HEADER_LENGTH, decode_raw_request
from services.gateway.rest.responses import gateway_error_response
from services.gateway.shaping.shaper import Admitted
from services.gateway.tensors.regions import tensor_regions
from services.gateway.versions.numbers import parse_version

PROTOCOL = "http"
CLIENT_GONE = "switchyard.client_gone"
"""The scope key the HTTP protocol sets when a request's connection is lost before its answer was written, just before
it cancels the request's task (``connections.DeadlineProtocol.connection_lost``): the lane then counts the request as
given up (499) and no longer works for it: a request waiting for admission or in a batch queue leaves it."""
PREFIX = "/v2/models/"
SUFFIX = "/infer"
log = logging.getLogger(__name__)


def infer_target(scope: Scope) -> tuple[str, str | None] | None:
    """``(model, raw version)`` when the request is an inference call, else ``None`` (FastAPI answers it: other
    routes, other methods, malformed paths alike). The path segments follow Starlette's ``{name}`` rule: non-empty,
    no slash."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    root = scope.get("root_path")
    if root:
        return _target(path[len(root) :] if path.startswith(root) else path)
    target = _TARGETS.get(path)
    if target is None:
        target = _target(path)
        if target is not None and len(path) <= TARGET_PATH_CACHED:
            if len(_TARGETS) >= TARGETS_CACHED:  # clients may name models that do not exist: a bounded memory
                _TARGETS.clear()
            _TARGETS[path] = target
    return target


TARGETS_CACHED = 1024
TARGET_PATH_CACHED = 256
_TARGETS: dict[str, tuple[str, str | None]] = {}
"""Inference paths seen, and their targets: parsing one costs more than a dict lookup on every request."""


def _target(path: str) -> tuple[str, str | None] | None:
    if not (path.startswith(PREFIX) and path.endswith(SUFFIX)):
        return None
    parts = path[len(PREFIX) : -len(SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


class InferLane:
    def __init__(self, dataplane: DataPlane, *, max_body_bytes: int) -> None:
        self._dataplane = dataplane
        self._max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send, model: str, raw_version: str | None) -> None:
        """Never raises: every failure becomes its answer here, so that no exception reaches the server (which
        would drop the keep-alive connection) and every answer is counted."""
        started = time.monotonic()
        dataplane = self._dataplane
        # First occurrence wins, as with Starlette's Headers.get: one pass, then dict lookups.
        headers: dict[bytes, bytes] = dict(reversed(scope["headers"]))
        admitted = Admitted()
        shaper = dataplane.shaper
        try:
            size = declared_length(headers.get(b"content-length"))
            await shaper.admit(admitted, model, PROTOCOL, api_key=_text(headers.get(b"x-api-key")), size=size)
            version = None if raw_version is None else parse_version(raw_version)  # decoding, as gRPC's field
            coded = headers.get(b"content-encoding")
            inflater = None if coded is None else inflater_for(coded, self._max_body)
            if inflater is None:
                body = await read_body(receive, self._max_body)
            else:  # Inference-Header-Content-Length counts the inflated body's bytes, as with Triton
                body = await read_inflated_body(receive, self._max_body, inflater)
            regions = tensor_regions(dataplane.regions, admitted.tenant)
            header_length = headers.get(b"inference-header-content-length")
            if header_length == RAW_HEADER_LENGTH:  # no JSON: the input is the model's own (rare, so looked up)
                metadata = await dataplane.model_metadata(model, version)
                request, fmt = decode_raw_request(body, metadata, model, version)
            else:
                request, fmt = decode_request(
                    body, None if header_length is None else header_length.decode("latin-1"), model, version, regions
                )
            timeout, priority = headers.get(b"x-request-timeout"), headers.get(b"x-priority")
            shaper.shape(request, admitted, started, timeout=_text(timeout), priority=_text(priority))
        except GatewayError as exc:
            dataplane.record_error(model, raw_version, PROTOCOL, exc, admitted.tenant)
            await gateway_error_response(exc)(scope, receive, send)
            return
        except ClientDisconnect:  # not our failure: one debug line and a count, no traceback
            log.debug("client disconnected before sending the whole request body for model '%s'", model)
            gone = ClientGone("the client went away before its request body arrived")
            dataplane.record_error(model, raw_version, PROTOCOL, gone, admitted.tenant)
            await _bare(send, 400)  # the server drops it: there is no one to send it to
            return
        except Exception as exc:
            await self._unexpected(scope, receive, send, exc, model, raw_version, admitted.tenant)
            return
        except asyncio.CancelledError:  # waiting for admission or for the body
            if not scope.get(CLIENT_GONE):
                raise  # the server is stopping
            gone = ClientGone("the client closed its connection before its request was read")
            dataplane.record_error(model, raw_version, PROTOCOL, gone, admitted.tenant)
            return
        try:
            response = await dataplane.infer(request, protocol=PROTOCOL, header=_HeaderLookup(headers).get)
        except GatewayError as exc:  # counted by the dataplane
            await gateway_error_response(exc)(scope, receive, send)
            return
        except asyncio.CancelledError:
            if not scope.get(CLIENT_GONE):
                raise
            gone = ClientGone("the client closed its connection before its answer")
            dataplane.record_error(model, request.counted_version(), PROTOCOL, gone, admitted.tenant)
            return
        accept = headers.get(b"accept-encoding")
        coding: tuple[tuple[bytes, bytes], ...] = ()
        try:
            content, header_length_out = encode_response(response, fmt)
            if accept is not None:
                content, coding = encode_answer(content, accept)
        except Exception as exc:
            await self._unexpected(scope, receive, send, exc, model, raw_version, admitted.tenant)
            return
        answer = AnswerHeaders(len(content), response.version, header_length_out, coding)
        sent: Iterable[tuple[bytes, bytes]] = answer
        limits = admitted.limits
        if limits:  # values from the limits file's numbers: the usual check, as for any other answer
            sent = [*answer, *((name.lower().encode(), value.encode()) for name, value in limits.items())]
        await send({"type": "http.response.start", "status": 200, "headers": sent})
        await send({"type": "http.response.body", "body": content})

    async def _unexpected(
        self, scope: Scope, receive: Receive, send: Send, exc: Exception, model: str, raw: str | None, tenant: str
    ) -> None:
        """A bug on the way in or out: a counted 500 naming the request id its traceback is logged under."""
        error = unexpected(exc, f"{scope['method']} {scope['path']}")
        self._dataplane.record_error(model, raw, PROTOCOL, error, tenant)
        await gateway_error_response(error)(scope, receive, send)


class _HeaderLookup:
    """``header(name)`` over the raw header dict, for the router's sticky canary split (rarely called)."""

    __slots__ = ("_headers",)

    def __init__(self, headers: Mapping[bytes, bytes]) -> None:
        self._headers = headers

    def get(self, name: str) -> str | None:
        return _text(self._headers.get(name.lower().encode("latin-1")))


async def _bare(send: Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class LaneEndpoint:
    """The inference routes' entry in FastAPI's route table, for what reaches it (a ``root_path`` the quick check
    did not strip, say): the same lane, with the path parameters Starlette matched."""

    def __init__(self, lane: InferLane) -> None:
        self._lane = lane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        params = scope["path_params"]
        await self._lane(scope, receive, send, params["model_name"], params.get("model_version"))


class GatewayApp(FastAPI):
    """FastAPI with the inference lane in front of its middleware stack (``lane`` set by the app factory)."""

    lane: InferLane | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.lane
        if lane is not None:
            target = infer_target(scope)
            if target is not None:
                await lane(scope, receive, send, *target)
                return
        await super().__call__(scope, receive, send)
