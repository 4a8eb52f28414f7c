"""Reads a request body while it streams in, refusing it as soon as it outgrows the limit: a chunked body (no
Content-Length) is never read whole before the size check. Works on the raw ASGI ``receive`` so that the inference
lane and Starlette routes (``request.receive``) share it."""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.types import Receive

from services.gateway.errors import InvalidInput, PayloadTooLarge


def check_length(declared: bytes | str | None, limit: int) -> None:
    """413 from the declared ``Content-Length`` alone, before a byte of the body is read."""
    if declared is None:
        return
    text = declared if isinstance(declared, str) else declared.decode("latin-1")
    if not (text.isascii() and text.isdigit()):
        raise InvalidInput(f"Content-Length must be a number of bytes, got {text[:40]!r}")
    if len(text) > 18 or int(text) > limit:
        raise _too_large(f"request body of {text} bytes exceeds the {limit} byte limit")


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body; ``ClientDisconnect`` when the client went away before it arrived."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnect
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # the common case: one message, no copy
        _check_size(len(body), limit)
        return body
    chunks = [body]
    size = len(body)
    while True:
        _check_size(size, limit)
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            break
    _check_size(size, limit)
    return b"".join(chunks)


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise _too_large(f"request body exceeds the {limit} byte limit ({size} bytes received so far)")


def _too_large(message: str) -> PayloadTooLarge:
    # The rest of the body stays unread: the connection cannot carry another request, say so.
    return PayloadTooLarge(message, headers={"Connection": "close"})
