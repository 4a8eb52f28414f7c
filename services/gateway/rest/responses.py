"""The answers every REST route shares: compact JSON without Starlette's re-validation, the v2 error shape, a 500."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response

from services.gateway.errors import GatewayError, unexpected


class JSONBytesResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(message: str, status: int) -> Response:
    """The v2 error shape: ``{"error": "..."}``."""
    return JSONBytesResponse({"error": message}, status_code=status)


def gateway_error_response(error: GatewayError, *, fields: Mapping[str, Any] | None = None) -> Response:
    """The answer to a ``GatewayError`` on every REST route: its status and message (with ``fields`` beside it, e.g.
    the failed step of a version action), and the headers it carries."""
    body = {"error": str(error), **fields} if fields else {"error": str(error)}
    response = JSONBytesResponse(body, status_code=error.status)
    headers = response.headers
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(error.retry_after_s)
    if error.version is not None:  # which version failed: what a canary's watcher (and its operator) needs
        headers["X-Model-Version"] = str(error.version)
    if error.request_id is not None:
        headers["X-Request-Id"] = error.request_id
    for name, value in error.headers.items():
        headers[name] = value
    if error.status == 413:  # the rest of the body stays unread: the connection cannot carry another request
        headers["Connection"] = "close"
    return response


def internal_error(method: str, path: str, exc: BaseException) -> Response:
    """A bug's answer on a FastAPI route: a generic 500 naming a request id, under which the cause is logged once."""
    return gateway_error_response(unexpected(exc, f"{method} {path}"))
