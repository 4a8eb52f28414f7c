"""Keep-alive HTTP/1.1 connections to Triton's HTTP front end, for inference calls.

A grpc.aio client call costs the gateway more CPU per request than everything else it does for a small model; a
request written on a kept-alive connection and its answer read by httptools' parser cost a fraction of that (the
figures are on the benchmarks page, docs/benchmarks.md). One request at a time per connection (no pipelining);
idle connections are reused; a connection whose call failed or timed out is closed, never reused."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import httptools


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    header_length: int | None
    """``Inference-Header-Content-Length``: the JSON part's length when binary outputs follow it."""
    body: bytes


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Reply] | None = None
        self._chunks: list[bytes] = []
        self._header_length: int | None = None
        self._keep = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TCP transport does not subclass it

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"Triton sent a malformed HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError(f"Triton closed the connection{f': {exc}' if exc else ''}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self._header_length = int(value) if value.isdigit() else -1

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        self._keep = self._parser.should_keep_alive()
        body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        reply = Reply(self._parser.get_status_code(), self._header_length, body)
        self._chunks, self._header_length = [], None
        if waiter is not None and not waiter.done():
            waiter.set_result(reply)

    # the pool's side
    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep and self._waiter is None

    def send(self, parts: Sequence[bytes | memoryview]) -> asyncio.Future[Reply]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.writelines(parts)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.close()


class HttpPool:
    """Connections to one Triton; as many are opened as calls run at once (``TritonCalls`` caps those)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[_Connection] = []

    async def call(self, head: bytes, parts: Sequence[bytes | memoryview]) -> Reply:
        """Send ``head`` (request line and headers) and ``parts`` (the body); the caller bounds the time (a
        cancelled call closes its connection)."""
        connection = await self._take()
        try:
            reply = await connection.send([head, *parts])
        except BaseException:
            connection.close()
            raise
        if connection.reusable:
            self._idle.append(connection)
        else:
            connection.close()
        return reply

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    async def _take(self) -> _Connection:
        idle = self._idle
        while idle:
            connection = idle.pop()
            if connection.reusable:
                return connection
        _, connection = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        return connection
