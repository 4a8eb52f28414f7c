"""A JSON response that skips Starlette's JSON re-validation and uses compact separators."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class JSONBytesResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(message: str, status: int) -> Response:
    """The v2 error shape: ``{"error": "..."}``."""
    return JSONBytesResponse({"error": message}, status_code=status)
