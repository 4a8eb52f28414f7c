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


class ClientGone(GatewayError):
    """Counted, never sent: the client went away (closed its connection before its body arrived, cancelled its gRPC
    call or closed its stream) before its answer. 499 is nginx's code for it; with it in
    ``switchyard_requests_total`` a wave of clients giving up shows, instead of the requests vanishing."""

    status = 499

    def __init__(self, what: str = "the client went away before its answer") -> None:
        super().__init__(what)


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


# Triton's words. Clients and ops scripts written for Triton match on these texts, so every error for one of these
# cases starts with Triton's wording (as Triton 2.51 answers it) and adds what the gateway knows after "; ".
UNKNOWN_MODEL = "Request for unknown model"
JSON_UNPARSED = "failed to parse the request JSON buffer"


def _more(text: str, detail: str | None) -> str:
    return f"{text}; {detail}" if detail else text


def unknown_model(model: str, detail: str | None = None) -> ModelNotFound:
    return ModelNotFound(_more(f"{UNKNOWN_MODEL}: '{model}' is not found", detail))


def unknown_version(model: str, version: int, detail: str | None = None) -> ModelNotFound:
    """A version the model does not serve (not on disk, or on disk and not loaded: Triton words both alike)."""
    return ModelNotFound(_more(f"{UNKNOWN_MODEL}: '{model}' version {version} is not found", detail))


def no_available_versions(model: str, detail: str | None = None) -> ModelNotFound:
    """A known model none of whose versions is loaded (unloaded through the repository API)."""
    return ModelNotFound(_more(f"{UNKNOWN_MODEL}: '{model}' has no available versions", detail))


def version_not_ready(model: str, version: int, detail: str | None = None) -> ModelNotReady:
    """A loaded version that cannot serve now (loading, warming up, its server lost it): worth a retry."""
    return ModelNotReady(_more(f"{UNKNOWN_MODEL}: '{model}' version {version} is not at ready state", detail))


def model_not_ready(model: str, detail: str | None = None) -> ModelNotReady:
    """A model with no version ready yet (still loading, or one that failed to). Triton says "no available
    versions" and answers 404; the gateway answers 503, since a retry may succeed."""
    return ModelNotReady(_more(f"{UNKNOWN_MODEL}: '{model}' has no available versions", detail))


def no_statistics(model: str, version: int | None = None, detail: str | None = None) -> ModelNotFound:
    """The statistics extension's own wording for a model (version) with nothing ready to report on."""
    if version is None:
        return ModelNotFound(_more(f"requested model '{model}' is not available", detail))
    return ModelNotFound(_more(f"requested model version is not available for model '{model}'", detail))


def poll_failed(model: str, detail: str) -> str:
    """A load refused before any version is touched: the model is not in the repository, its config cannot be
    read, or the ``config`` override is not one it can take. Triton fails these while polling the repository."""
    return f"failed to load '{model}', failed to poll from model repository; {detail}"


def load_failed(model: str, version: int, cause: str) -> str:
    """A load whose version failed to load or to warm up; ``cause`` says why and what keeps serving."""
    return f"load failed for model '{model}': version {version} is at UNAVAILABLE state: {cause}"


def unparsed_json(detail: str) -> str:
    return f"{JSON_UNPARSED}: {detail}"


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
