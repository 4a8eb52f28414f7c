"""Reads a request body while it streams in, refusing it as soon as it outgrows the limit: a chunked body (no
Content-Length) is never read whole before the size check."""

from __future__ import annotations

from starlette.requests import Request

from services.gateway.errors import InvalidInput, PayloadTooLarge


def check_length(request: Request, limit: int) -> None:
    """413 from the declared ``Content-Length`` alone, before a byte of the body is read."""
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not (declared.isascii() and declared.isdigit()):
        raise InvalidInput(f"Content-Length must be a number of bytes, got {declared[:40]!r}")
    if len(declared) > 18 or int(declared) > limit:
        raise _too_large(f"request body of {declared} bytes exceeds the {limit} byte limit")


async def read_body(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(f"request body exceeds the {limit} byte limit ({size} bytes received so far)")
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(message: str) -> PayloadTooLarge:
    # The rest of the body stays unread: the connection cannot carry another request, say so.
    return PayloadTooLarge(message, headers={"Connection": "close"})
