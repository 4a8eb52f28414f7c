"""Reads a request body while it streams in, refusing it as soon as it outgrows the limit: a chunked body (no
Content-Length) is never read whole before the size check. Works on the raw ASGI ``receive`` so that the inference
lane and Starlette routes (``request.receive``) share it."""

from __future__ import annotations

from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from services.gateway.errors import InvalidInput, PayloadTooLarge
from services.gateway.rest.compression import Inflater
from services.gateway.shaping.json_limits import client_json


def declared_length(declared: bytes | str | None) -> int | None:
    """The ``Content-Length`` as a number (``None`` when absent); 400 when it is not one."""
    if declared is None:
        return None
    text = declared if isinstance(declared, str) else declared.decode("latin-1")
    if not (text.isascii() and text.isdigit()):
        raise InvalidInput(f"Content-Length must be a number of bytes, got {text[:40]!r}")
    return int(text) if len(text) <= 18 else 10**18  # beyond any limit; int() never sees a huge string


def check_length(declared: bytes | str | None, limit: int) -> None:
    """413 from the declared ``Content-Length`` alone, before a byte of the body is read."""
    length = declared_length(declared)
    if length is not None and length > limit:
        raise _too_large(f"request body of {length} bytes exceeds the {limit} byte limit")


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


async def read_inflated_body(receive: Receive, limit: int, inflater: Inflater) -> bytes:
    """The body of a request sent with a ``Content-Encoding``, inflated: the compressed bytes are held to ``limit``
    as they arrive (as in ``read_body``) and each piece is inflated at once, so that neither the compressed nor the
    inflated body is ever held past the limit (the inflater refuses the inflated bytes past it)."""
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunk: bytes = message.get("body", b"")
        received += len(chunk)
        _check_size(received, limit)
        inflater.feed(chunk)
        if not message.get("more_body", False):
            return inflater.finish()


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise _too_large(f"request body exceeds the {limit} byte limit ({size} bytes received so far)")


def _too_large(message: str) -> PayloadTooLarge:
    # The rest of the body stays unread: the connection cannot carry another request, say so.
    return PayloadTooLarge(message, headers={"Connection": "close"})


async def read_json_object(
    request: Request, limit: int, *, what: str = "the request body", allowed: set[str] | None = None
) -> dict[str, Any]:
    """The JSON object a route takes (admin, repository, shared memory): its size checked against ``limit`` (the
    configured ``max_body_bytes``) before and while it arrives, parsed with the depth and number bounds of
    ``client_json``; an empty body is ``{}``. With ``allowed``, any other key is refused by name."""
    check_length(request.headers.get("content-length"), limit)
    raw = await read_body(request.receive, limit)
    if not raw.strip():
        return {}
    data = client_json(raw, what)
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    if allowed is not None:
        for key in sorted(set(data) - allowed):
            raise InvalidInput(f"unknown field {key!r} in {what}; expected: {', '.join(sorted(allowed)) or 'none'}")
    return data
