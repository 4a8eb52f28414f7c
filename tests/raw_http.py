"""Raw HTTP/1.1 exchanges for tests of what a client may send before the gateway reads a request: the request is
written piece by piece on a plain socket, stopping as soon as the gateway answers or closes, and the answer read
until the connection ends. Also the gateway process's memory, read from /proc."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ANSWER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RawAnswer:
    status: int | None
    """The answer's status code; None when the connection ended without one."""
    head: bytes
    body: bytes
    sent: int
    """Bytes the client got to write before the gateway answered or closed."""
    closed: bool
    """The gateway closed the connection after answering."""


def exchange(port: int, pieces: Iterable[bytes], *, keep_open: bool = False) -> RawAnswer:
    """Write ``pieces`` one by one to 127.0.0.1:``port`` until all are sent or the gateway answers or closes, then
    read its answer. ``keep_open``: the request is expected to be served; read one answer and leave the connection
    be (``closed`` then says whether the gateway announced ``connection: close``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S) as connection:
        received = b""
        sent = 0
        for piece in pieces:
            received += _ready_bytes(connection)
            if received:
                break
            try:
                connection.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        return _answer(connection, received, sent, keep_open)


def _ready_bytes(connection: socket.socket) -> bytes:
    """What the gateway has sent so far, without waiting."""
    connection.setblocking(False)
    try:
        return connection.recv(65536)
    except (BlockingIOError, ConnectionResetError):
        return b""
    finally:
        connection.setblocking(True)
        connection.settimeout(ANSWER_TIMEOUT_S)


def _answer(connection: socket.socket, received: bytes, sent: int, keep_open: bool) -> RawAnswer:
    closed = False
    try:
        while True:
            if keep_open and b"\r\n\r\n" in received:
                head, _, body = received.partition(b"\r\n\r\n")
                length = _content_length(head)
                if length is not None and len(body) >= length:
                    break
            data = connection.recv(65536)
            if not data:
                closed = True
                break
            received += data
    except ConnectionResetError:
        closed = True
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else None
    if keep_open:
        closed = closed or b"connection: close" in head.lower()
    return RawAnswer(status, head, body, sent, closed)


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return None


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``, the peak) of process ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


def reset_peak_rss(pid: int) -> None:
    """Make ``VmHWM`` start again from the current RSS (Linux's clear_refs), so that a peak measured next is the
    peak of what follows, not of the process's startup."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
