"""uvicorn's httptools protocol with connection deadlines, a connection cap and limits on the request head: a client
that sends nothing, or sends its request slowly, or opens connections without end, or sends headers without end,
cannot hold the gateway's file descriptors or memory."""

from __future__ import annotations

import asyncio
import enum
import logging
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn, cast

import httptools
import orjson
from starlette.types import Scope
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from services.gateway.rest.direct import answer_inference
from services.gateway.rest.lane import CLIENT_GONE, InferLane, infer_target
from services.gateway.rest.one_write import OneWrite

log = logging.getLogger(__name__)


CLOCK_SLACK_S = 0.002
"""How early a timer may fire on uvloop's millisecond clock and still count as on time."""


class Phase(enum.Enum):
    HEAD = "head"  # waiting for a request's headers: the header deadline runs
    BODY = "body"  # headers complete, body still arriving: the body deadline runs
    OTHER = "other"  # the request is with the app, or the connection is idle in keep-alive (uvicorn's timer)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    """From connecting, or from the first byte of a keep-alive connection's next request, to complete headers."""
    body_timeout_s: float
    """From complete headers to the end of the body."""
    max_connections: int
    """Open HTTP connections at most; a connection beyond it is answered 503 and closed at once."""
    max_header_bytes: int
    """A request head (request line and headers) larger than this is answered 431 and its connection closed."""
    max_header_line_bytes: int
    """The longest request line (its URL) or header line (name and value)."""
    max_header_count: int
    """Header lines a request may have."""

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s and body_timeout_s must be positive")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if min(self.max_header_bytes, self.max_header_line_bytes, self.max_header_count) < 1:
            raise ValueError("max_header_bytes, max_header_line_bytes and max_header_count must be at least 1")


class HeadTooLarge(Exception):
    """Raised from a parser callback to stop httptools at once (it raises ``HttpParserCallbackError`` then)."""


def raw_response(status: bytes, message: str) -> bytes:
    """A whole ``Connection: close`` response, built once per protocol class: written from ``connection_made`` or
    a timer, where no ASGI cycle exists to write one."""
    body = orjson.dumps({"error": message})
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
    return head % (status, len(body)) + body


def protocol_class(limits: ConnectionLimits, lane: InferLane | None = None) -> type[DeadlineProtocol]:
    """The class to hand ``uvicorn.Config(http=...)``: uvicorn instantiates it with its own arguments only, so the
    limits (and the app's inference lane, called directly: ``direct.py``) travel as class attributes of a subclass
    made for them."""
    header = f"request headers not complete within header_timeout_s={limits.header_timeout_s:g}s"
    body = f"request body not complete within body_timeout_s={limits.body_timeout_s:g}s"
    refused = f"the gateway holds max_connections={limits.max_connections} connections"
    too_large = b"431 Request Header Fields Too Large"
    head = f"the request head exceeds max_header_bytes={limits.max_header_bytes} (request line and headers)"
    line = f"a request line or header line exceeds max_header_line_bytes={limits.max_header_line_bytes}"
    count = f"the request has more than max_header_count={limits.max_header_count} headers"

    class BoundDeadlineProtocol(DeadlineProtocol):
        open: ClassVar[weakref.WeakSet[DeadlineProtocol]] = weakref.WeakSet()

    BoundDeadlineProtocol.limits = limits
    BoundDeadlineProtocol.lane = lane
    BoundDeadlineProtocol.header_timeout_response = raw_response(b"408 Request Timeout", header)
    BoundDeadlineProtocol.body_timeout_response = raw_response(b"408 Request Timeout", body)
    BoundDeadlineProtocol.refusal = raw_response(b"503 Service Unavailable", refused)
    BoundDeadlineProtocol.head_too_large = raw_response(too_large, head)
    BoundDeadlineProtocol.line_too_long = raw_response(too_large, line)
    BoundDeadlineProtocol.too_many_headers = raw_response(too_large, count)
    BoundDeadlineProtocol.max_head = limits.max_header_bytes
    BoundDeadlineProtocol.max_line = limits.max_header_line_bytes
    BoundDeadlineProtocol.max_count = limits.max_header_count
    return BoundDeadlineProtocol


class DeadlineProtocol(HttpToolsProtocol):
    """At most one deadline timer per connection, armed only when the phase changes across ``data_received``: a
    request that arrives in one read costs no timer at all. The keep-alive timer is one per connection too, armed
    when the connection first goes idle and left armed while it is used (uvicorn arms a fresh one after every answer
    and cancels it on the next request's bytes: two timer operations per request).

    The request head is measured while it arrives, so that a head over the limits is refused (431, connection
    closed) before it is held whole: the parser's callbacks count the URL and each complete header line (O(1) each),
    and the bytes of every read that leaves the head still incomplete are counted too, since httptools holds a line
    in progress until it ends. Each count is a lower bound of the head's size: neither refuses a head within the
    limits, and a connection holds at most one read beyond ``max_header_bytes``."""

    limits: ClassVar[ConnectionLimits]
    lane: ClassVar[InferLane | None] = None
    open: ClassVar[weakref.WeakSet[DeadlineProtocol]]
    """This listener's connections (uvicorn's own set is its server's, out of reach of the TLS watcher)."""
    header_timeout_response: ClassVar[bytes]
    body_timeout_response: ClassVar[bytes]
    refusal: ClassVar[bytes]
    head_too_large: ClassVar[bytes]
    line_too_long: ClassVar[bytes]
    too_many_headers: ClassVar[bytes]
    # The limits again, as plain class attributes: the header callback reads them once per header line.
    max_head: ClassVar[int]
    max_line: ClassVar[int]
    max_count: ClassVar[int]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._phase = Phase.HEAD
        self._timed = Phase.OTHER  # what the armed timer (if any) guards
        self._timer: asyncio.TimerHandle | None = None
        self._silent = True
        self._idle_since: float | None = None
        """Loop time since which the connection has waited for a next request (``None``: reading or serving one)."""
        self._keep_alive: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        """Bytes of the current head the parser handed over: URL fragments and complete header lines."""
        self._head_lines = 0
        self._fed = -1
        """Bytes of the reads that arrived while the current head was incomplete, from the read after the one it
        began in (-1: it began in the read being parsed, whose bytes may belong to the request before)."""
        self._refusal: bytes | None = None
        """The 431 a parser callback chose; ``data_received`` sends it."""
        self._answering: tuple[RequestResponseCycle, asyncio.Task[None]] | None = None
        """The inference request the lane answers directly (the last one started) and its task."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            # Closed before uvicorn counts it: connection_lost still runs and needs the transport.
            self.transport = transport
            transport.write(self.refusal)
            transport.close()
            return
        super().connection_made(transport)
        self.open.add(self)
        self._watch(Phase.HEAD)

    @classmethod
    def close_client_authenticated(cls) -> int:
        """End every connection whose client presented a certificate: at once when it is idle, after the answer it
        is writing otherwise (a client CA was removed: such a client must show its certificate again, to the CAs in
        force, and the handshake that checked it is the connection's first). The number of connections ended."""
        ended = 0
        for connection in list(cls.open):
            transport = getattr(connection, "transport", None)
            tls = None if transport is None or transport.is_closing() else transport.get_extra_info("ssl_object")
            if tls is not None and tls.getpeercert(binary_form=True):
                connection.shutdown()
                ended += 1
        return ended

    def connection_lost(self, exc: Exception | None) -> None:
        self._watch(Phase.OTHER)
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None
        super().connection_lost(exc)
        answering, self._answering = self._answering, None
        if answering is not None:
            cycle, task = answering
            if not task.done() and not cycle.response_complete:
                # The client gave up: its request stops waiting for a concurrency slot or a batch and is counted
                # as given up (the lane reads the mark), not as the 200 no one receives.
                cycle.scope[CLIENT_GONE] = True  # type: ignore[literal-required]
                task.cancel()

    def data_received(self, data: bytes) -> None:
        before = self._phase
        self._silent = False
        self._idle_since = None  # not idle while the bytes are read: the keep-alive timer leaves the connection be
        # uvicorn's steps, in this frame: a head over the limits stops the parser from a callback, and is answered
        # 431 rather than logged as an invalid request. (uvicorn's own keep-alive timer, which its step would
        # cancel here, is never armed: ``on_response_complete``.)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(self._refusal)
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        phase = self._phase
        if phase is Phase.OTHER and (self.cycle is None or self.cycle.response_complete):
            if before is Phase.OTHER:
                # Bytes that begin no request (stray CRLFs) end the idle wait: without a deadline a client could
                # hold the connection by sending one every keep-alive period.
                phase = self._phase = Phase.HEAD
                self._fed = 0
            elif not self.transport.is_closing():
                # The app answered before the body ended: idle again from the body's tail.
                self._rest()
        elif phase is Phase.HEAD:  # the head is still incomplete after this read
            fed = self._fed
            fed = self._fed = fed + len(data) if fed >= 0 else 0
            if fed > self.max_head and not self.transport.is_closing():
                self._refuse(self.head_too_large)
                return
        self._watch(phase)

    def on_response_complete(self) -> None:
        """uvicorn's own steps after an answer, but the keep-alive wait starts with ``_rest``, not a new timer."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # a pipelined request waits: its turn now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._rest()

    def _rest(self) -> None:
        """Idle from now until a next request; the timer is armed only if none is."""
        now = self._idle_since = self.loop.time()
        if self._keep_alive is None:
            self._keep_alive = self.loop.call_at(now + self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        """Close the connection if it has been idle for the whole keep-alive period, else wait for the rest of it
        (it was used since); one busy serving a request is left alone, its answer starts the wait again."""
        self._keep_alive = None
        since = self._idle_since
        if since is None or self.transport.is_closing():
            return
        due = since + self.timeout_keep_alive
        if self.loop.time() >= due - CLOCK_SLACK_S:
            self.timeout_keep_alive_handler()
        else:
            self._keep_alive = self.loop.call_at(due, self._keep_alive_due)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = Phase.HEAD
        self._head_bytes = self._head_lines = 0
        self._fed = -1

    def on_url(self, url: bytes) -> None:
        """uvicorn's step (the URL may come in fragments), with the URL counted against the limits."""
        self.url += url
        head = self._head_bytes = self._head_bytes + len(url)
        if len(self.url) > self.max_line or head > self.max_head:
            self._over_limit(len(self.url), head)

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's steps, after counting the line against the limits: inlined rather than through ``super()``,
        since this runs for every header of every request."""
        size = len(name) + len(value)
        head = self._head_bytes = self._head_bytes + size + 4  # ": " and CRLF
        lines = self._head_lines = self._head_lines + 1
        if size > self.max_line or head > self.max_head or lines > self.max_count:
            self._over_limit(size, head)
        name = name.lower()
        # llhttp keeps trailing whitespace, which RFC 9110 section 5.5 excludes from the value.
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _over_limit(self, line: int, head: int) -> NoReturn:
        """Stop the parser (this runs in one of its callbacks); ``data_received`` answers the first limit passed."""
        if line > self.max_line:
            self._refusal = self.line_too_long
        else:
            self._refusal = self.head_too_large if head > self.max_head else self.too_many_headers
        raise HeadTooLarge

    def _refuse(self, response: bytes) -> None:
        """Answer a head over the limits and close the connection; the answer is left out while an earlier request
        on the connection is still being answered (it must not be cut into)."""
        log.debug("closing %s: %s", self.client, response.partition(b"\r\n")[0].decode())
        cycle = self.cycle
        if (cycle is None or cycle.response_complete) and not self.pipeline:
            self.transport.write(response)
        elif cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
        self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._phase = Phase.BODY

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """uvicorn's hook for starting a request's ASGI task (from the headers, or a pipelined request's turn).
        Inference requests go to the lane directly unless the access log is asked for (uvicorn's send writes it)
        or uvicorn answers in place of the app (its concurrency limit). The setting decides, not whether the
        access logger has handlers: a test's log capture must not send the suite down another path. Every other
        request writes through ``OneWrite``; the lane writes its answer in one piece itself."""
        lane = self.lane
        direct = lane is not None and app is self.app and not self.config.access_log
        target = infer_target(cast(Scope, cycle.scope)) if direct else None
        if target is None:
            cycle.transport = OneWrite(self.transport, self.loop)  # type: ignore[assignment]
            super()._start_asgi_task(cycle, app)
            return
        assert lane is not None
        task = self.loop.create_task(answer_inference(lane, cycle, target))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._answering = (cycle, task)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = Phase.OTHER

    def handle_websocket_upgrade(self) -> None:
        self._watch(Phase.OTHER)  # the transport changes hands; this protocol's deadline must not close it
        super().handle_websocket_upgrade()

    def _watch(self, phase: Phase) -> None:
        """Keep the timer that ``phase`` needs; a deadline runs from when its phase began, not from the last byte."""
        if phase is self._timed:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timed = phase
        if phase is Phase.HEAD:
            self._timer = self.loop.call_later(self.limits.header_timeout_s, self._expire)
        elif phase is Phase.BODY:
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._expire)

    def _expire(self) -> None:
        phase, self._timer, self._timed = self._timed, None, Phase.OTHER
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The server stopped reading (a pipelined request waits, or the app reads the body slowly): the client
            # could not send, so the time does not count against it.
            self._watch(phase)
            return
        cycle = self.cycle
        if phase is Phase.HEAD:
            answerable = not self._silent and (cycle is None or cycle.response_complete)
            response = self.header_timeout_response
        else:
            answerable = cycle is not None and not cycle.response_started
            response = self.body_timeout_response
        log.debug("closing %s: %s deadline passed", self.client, phase.value)
        if answerable and not self.pipeline:
            self.transport.write(response)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's own response must not follow the 408 onto the wire
        self.transport.close()
