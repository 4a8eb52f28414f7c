"""The inference lane called straight from the connection, without the ASGI layers uvicorn puts around an app.

For ``POST /v2/models/{m}[/versions/{v}]/infer`` the HTTP protocol (``connections.DeadlineProtocol``) starts
``answer_inference`` instead of uvicorn's ``run_asgi``: no proxy-headers middleware (nothing on this path reads the
client address: requests that must be access-logged take uvicorn's way), no app dispatch, and the answer's head and
body built and written together, once. The lane itself is unchanged and still speaks ASGI: ``DirectAnswer.receive``
hands over a body that arrived whole and leaves the rest to the cycle uvicorn made for the request (a body still
arriving, flow control, ``100 Continue``, disconnects); the lane sends ``start`` then one ``body`` message to
``DirectAnswer.send``. Measured on loopback, uvicorn's send path (two coroutine calls, a regex
per header, a separate head write or OneWrite's deferred flush) cost a small request more than routing it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from http import HTTPStatus
from typing import cast

from starlette.types import Message, Scope
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from services.gateway.rest.answer_head import AnswerHeaders
from services.gateway.rest.lane import CLIENT_GONE, InferLane

log = logging.getLogger(__name__)

_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""What a header value must not hold (it would split the head): the check uvicorn makes on every value."""
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-zA-Z]+")
"""What a header name must be (an HTTP token): the check uvicorn makes on every name."""
_STATUS_LINES: dict[int, bytes] = {}


class _DefaultHeaders:
    rendered: tuple[object, bytes] = (None, b"")
    """The server's default headers (a list uvicorn replaces when the date changes) and their bytes, as one value
    so that a server on another thread never reads one's list with the other's bytes."""


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode("latin-1"))
    return line


async def answer_inference(lane: InferLane, cycle: RequestResponseCycle, target: tuple[str, str | None]) -> None:
    """Run the lane for one request; what uvicorn's ``run_asgi`` does if the lane breaks its promise to answer."""
    transport = cycle.transport
    answer = DirectAnswer(cycle)
    try:
        await lane(cast(Scope, cycle.scope), answer.receive, answer.send, *target)
    except BaseException as exc:  # the lane answers its own failures: this is a bug, or the server shutting down
        if isinstance(exc, asyncio.CancelledError) and cycle.scope.get(CLIENT_GONE):
            return  # cancelled while it wrote an answer already counted: the client is gone, nothing is left to do
        log.error("the inference lane failed", exc_info=exc)
        if not cycle.response_started:
            await cycle.send_500_response()
        else:
            transport.close()
    else:
        if not cycle.response_complete and not cycle.disconnected:
            log.error("the inference lane returned without completing its response")
            transport.close()
    finally:
        cycle.on_response = _nothing  # as uvicorn does: the protocol's callback is not held past the request


def _nothing() -> None:
    return None


class DirectAnswer:
    """``receive`` and ``send`` of one inference request: a body already whole is handed over as it is; the start
    message is held, and written with the body as one buffer."""

    __slots__ = ("_cycle", "_start")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._start: Message | None = None

    async def receive(self) -> Message:
        """The body when it is all there (nearly every inference request: it comes in the headers' read); anything
        else (a body still arriving, ``100 Continue`` to send, a client gone) is uvicorn's receive."""
        cycle = self._cycle
        if cycle.more_body or cycle.waiting_for_100_continue or cycle.disconnected or cycle.response_complete:
            return cast(Message, await cycle.receive())
        body = bytes(cycle.body)
        cycle.body = bytearray()
        cycle.message_event.clear()
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(self, message: Message) -> None:
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()  # the client is not reading: wait, as uvicorn's send does
        if cycle.disconnected:
            return
        kind = message["type"]
        if kind == "http.response.start" and not cycle.response_started:
            self._start = message
            cycle.response_started = True
            cycle.waiting_for_100_continue = False
            return
        start = self._start
        if start is None or kind != "http.response.body" or cycle.response_complete or message.get("more_body"):
            # The lane sends one start and one whole body; anything else is a bug to see, not to stream.
            raise RuntimeError(f"the inference lane sent {kind!r} out of order")
        body: bytes = message.get("body", b"")
        transport = cycle.transport  # the connection's own: the lane's cycles write through no OneWrite
        transport.write(self._head(start, len(body)) + body)
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()

    def _head(self, start: Message, length: int) -> bytes:
        cycle = self._cycle
        defaults = cycle.default_headers  # the server's: date, and the keep-alive we set
        rendered = _DefaultHeaders.rendered
        if rendered[0] is not defaults:
            rendered = _DefaultHeaders.rendered = (defaults, b"".join([n + b": " + v + b"\r\n" for n, v in defaults]))
        headers = start.get("headers", ())
        if type(headers) is AnswerHeaders:
            end = b"\r\n" if cycle.keep_alive else b"connection: close\r\n\r\n"
            return b"".join((status_line(start["status"]), rendered[1], headers.rendered(), end))
        return self._checked_head(start, length, rendered[1])

    def _checked_head(self, start: Message, length: int, defaults: bytes) -> bytes:
        """Headers from anywhere: each value checked, the length and ``Connection: close`` honoured."""
        cycle = self._cycle
        parts = [status_line(start["status"]), defaults]
        has_length = has_close = False
        for name, value in start.get("headers", ()):
            if not _TOKEN.fullmatch(name):
                raise RuntimeError(f"invalid name of response header {name!r}")
            if _CONTROL.search(value):
                raise RuntimeError(f"invalid value of response header {name!r}")
            if name == b"content-length":
                if int(value) != length:
                    raise RuntimeError(f"content-length {value!r} but the body has {length} bytes")
                has_length = True
            elif name == b"connection" and b"close" in value.lower():
                cycle.keep_alive = False
                has_close = True
            parts += (name, b": ", value, b"\r\n")
        if not has_length:
            parts.append(b"content-length: %d\r\n" % length)
        if not cycle.keep_alive and not has_close:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

