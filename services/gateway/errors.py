"""Gateway errors: each carries the HTTP status it maps to; gRPC maps the same types in one place."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from types import MappingProxyType


class GatewayError(Exception):
    """Base of every error a client may see; ``str(error)`` is the message sent back."""

    status: int = 500
    reason: str | None = None
    """Label for ``switchyard_rejected_total`` when the gateway (not the model) turned the request away."""
    retry_after_s: int | None = None
    """Seconds after which a retry may succeed (sent as ``Retry-After``); None: no hint."""
    version: int | None = None
    """The model version the request was routed to, when it got that far (sent as ``X-Model-Version``)."""
    request_id: str | None = None
    """Set on 500s: the id under which the gateway logged the cause (sent as ``X-Request-Id``)."""
    headers: Mapping[str, str] = MappingProxyType({})
    """More response headers (REST) / trailing metadata, lower-cased (gRPC): e.g. the rate-limit figures."""

    def __init__(self, message: str, status: int | None = None, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if headers is not None:
            self.headers = headers


class InvalidInput(GatewayError):
    status = 400
    reason = "invalid"


class ModelNotFound(GatewayError):
    status = 404
    reason = "not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    reason = "too_large"


class Unauthorized(GatewayError):
    status = 401
    reason = "unauthorized"


class Forbidden(GatewayError):
    status = 403


class Conflict(GatewayError):
    """The request contradicts the current state (a swap in progress, unloading the stable version)."""

    status = 409


class RateLimited(GatewayError):
    status = 429
    reason = "rate_limit"


class InferenceFailed(GatewayError):
    """The model itself failed on a batch; the message names the cause."""

    status = 500


class ModelNotReady(GatewayError):
    status = 503
    retry_after_s = 1  # loading, or its server is coming back: worth a retry soon


class BackendUnavailable(GatewayError):
    status = 503


class Overloaded(GatewayError):
    status = 503
    reason = "overload"
    retry_after_s = 1  # a slot frees within a request's time: a second is a polite floor


class DeadlineExceeded(GatewayError):
    status = 504
    reason = "deadline"


class SwapFailed(GatewayError):
    """A version action that stopped at ``step``; everything it did before was undone, the routing is unchanged."""

    def __init__(self, message: str, step: str, status: int) -> None:
        super().__init__(message, status)
        self.step = step


SHOWN = 40
"""How much of a malformed value (a version string, a datatype) an error message repeats."""


def shown(raw: str) -> str:
    """``raw`` quoted for an error message: trimmed, and with every non-ASCII or control character escaped so that
    look-alikes (``１`` for ``1``) show as what they are."""
    if len(raw) <= SHOWN:
        return ascii(raw)
    return f"{ascii(raw[:SHOWN])}... ({len(raw)} characters)"


_log = logging.getLogger("services.gateway")


def unexpected(exc: BaseException, where: str) -> GatewayError:
    """A bug's answer on any protocol: a 500 naming a request id, under which the cause is logged once with its
    traceback. The client never sees the exception's text (it can hold paths, tensors, internals)."""
    request_id = uuid.uuid4().hex[:16]
    _log.error("request %s: unexpected error in %s", request_id, where, exc_info=exc)
    error = GatewayError(f"internal server error (request id {request_id})", 500)
    error.request_id = request_id
    return error
