"""A JSON response that skips Starlette's JSON re-validation and uses compact separators."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from services.gateway.errors import GatewayError


class JSONBytesResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(message: str, status: int) -> Response:
    """The v2 error shape: ``{"error": "..."}``."""
    return JSONBytesResponse({"error": message}, status_code=status)


def gateway_error_response(error: GatewayError) -> Response:
    """The answer to a ``GatewayError``: its status and message, and the headers it carries."""
    response = error_response(str(error), error.status)
    headers = response.headers
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(error.retry_after_s)
    if error.version is not None:  # which version failed: what a canary's watcher (and its operator) needs
        headers["X-Model-Version"] = str(error.version)
    if error.request_id is not None:
        headers["X-Request-Id"] = error.request_id
    for name, value in error.headers.items():
        headers[name] = value
    return response
