"""An HTTP answer in one write: the status line and headers are held until the body's first bytes, then both go
out together. uvicorn writes them separately, and on loopback each write is a system call that costs about as much
as the rest of a small request's handling. A body that does not follow in the same loop turn (a stream that starts
later) gets its headers flushed at the end of the turn, so nothing waits on them."""

from __future__ import annotations

import asyncio

COPY_BELOW = 64 * 1024
"""Bodies up to this size are joined to the head (a copy); bigger ones are handed over with it as they are."""


class OneWrite:
    """Stands in for the transport of one request/response cycle (``write``, ``is_closing``, ``close``)."""

    __slots__ = ("_transport", "_loop", "_held", "_passing")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._passing = False

    def write(self, data: bytes) -> None:
        if self._passing:
            self._transport.write(data)
        elif self._held is None:  # the head: hold it for the body's first write
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._passing = True
            head, self._held = self._held, None
            if len(data) <= COPY_BELOW:
                self._transport.write(head + data)
            else:  # no copy of a big body: the transport gathers both
                self._transport.writelines((head, data))

    def flush(self) -> None:
        self._passing = True
        if self._held is not None:
            head, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()
