"""The answers every REST route shares: compact JSON without Starlette's re-validation, the v2 error shape, a 500."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import orjson
from starlette.responses import Response

from services.gateway.errors import GatewayError

log = logging.getLogger(__name__)


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


def internal_error(method: str, path: str, exc: BaseException) -> Response:
    """A bug's answer: a generic 500 naming a request id, under which the cause is logged once."""
    request_id = uuid.uuid4().hex[:16]
    log.error("request %s: unexpected error on %s %s", request_id, method, path, exc_info=exc)
    response = error_response(f"internal server error (request id {request_id})", 500)
    response.headers["X-Request-Id"] = request_id
    return response
