"""Triton's and gRPC's errors become gateway errors here and only here; the circuit breaker learns from them."""

from __future__ import annotations

import logging

import grpc

from services.gateway.backends.circuit import CircuitBreaker
from services.gateway.backends.triton.shared_memory import refused
from services.gateway.errors import (
    UNKNOWN_MODEL,
    BackendUnavailable,
    DeadlineExceeded,
    GatewayError,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    unknown_version,
    version_not_ready,
)
from services.modelrepo.control import ModelControlError

log = logging.getLogger(__name__)


class TritonErrors:
    def __init__(self, breaker: CircuitBreaker, url: str) -> None:
        self.breaker = breaker
        self.url = url

    def infer_error(self, code: str, message: str, model: str, version: int, timeout_s: float | None) -> GatewayError:
        """``code`` is the gRPC status name (``UNAVAILABLE``), ``message`` what Triton or gRPC said."""
        target = f"model '{model}' version {version}"
        shared_memory = refused(message, target)  # the request's regions: neither the model's nor Triton's health
        if shared_memory is not None:
            self.breaker.record_success()
            return shared_memory
        if code == "DEADLINE_EXCEEDED" or "timeout expired" in message.lower():
            self.breaker.release()
            budget = "its deadline" if timeout_s is None else f"its {timeout_s * 1e3:.1f} ms deadline"
            return DeadlineExceeded(f"request to {target} did not finish within {budget}")
        if code == "UNAVAILABLE" and not is_model_state(message):
            if "queue size" in message:
                self.breaker.record_success()
                return Overloaded(f"Triton's queue for {target} is full")
            self.breaker.record_failure()
            return self.unavailable(f"Triton at {self.url} is unavailable: {message}")
        self.breaker.record_success()  # Triton answered: it is up
        told = triton_words(message)
        # Triton words both with "Request for unknown model": the state comes first, "not at ready state" is a 503.
        if is_model_state(message):
            if told.startswith(UNKNOWN_MODEL):
                return ModelNotReady(f"{told}; not ready in Triton")
            return version_not_ready(model, version, "not ready in Triton")
        if code == "NOT_FOUND" or "is not found" in message or UNKNOWN_MODEL.lower() in message.lower():
            if told.startswith(UNKNOWN_MODEL):  # Triton's own words, which name what it does not serve
                return ModelNotFound(f"{told}; Triton does not serve {target}")
            return unknown_version(model, version, "Triton does not serve it")
        if code == "INVALID_ARGUMENT":
            return InvalidInput(f"{told} (Triton refused the request to {target})")
        if code == "RESOURCE_EXHAUSTED":
            return Overloaded(f"Triton refused the request to {target}: {message}")
        if code == "UNIMPLEMENTED":  # what Triton cannot do for this model: a decoupled one asked for one answer
            hint = "; stream it (gRPC ModelStreamInfer, HTTP generate_stream)" if "decoupled" in message else ""
            return GatewayError(f"{told}{hint}", 501)
        if code == "CANCELLED":
            return BackendUnavailable(f"Triton cancelled the request to {target}")
        return InferenceFailed(f"{target} failed in Triton: {message}")

    def rpc_error(self, exc: grpc.RpcError, model: str, version: int, timeout_s: float | None) -> GatewayError:
        """A failed gRPC inference call (``ModelInfer``, ``ModelStreamInfer``), told like ``infer_error``."""
        if isinstance(exc, grpc.aio.AioRpcError):
            return self.infer_error(exc.code().name, str(exc.details() or ""), model, version, timeout_s)
        return self.infer_error("UNKNOWN", str(exc), model, version, timeout_s)

    def control_error(self, exc: ModelControlError) -> GatewayError:
        """Model control answers go to operators (startup log, admin calls): they carry Triton's words."""
        if exc.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_SETTLED"):
            return self.unavailable(f"{exc} (Triton at {self.url})", public=True)
        if exc.code == "NOT_FOUND":
            return ModelNotFound(str(exc))
        return GatewayError(f"{exc}", 503)

    def unavailable(self, detail: str, *, public: bool = False) -> BackendUnavailable:
        """503 with ``Retry-After``. Inference clients learn that the model server is down, not where it runs
        or what gRPC said (``detail`` goes to the debug log); admin calls (``public``) get the detail."""
        retry = self.breaker.retry_after_s()
        if not public:
            log.debug("Triton unavailable: %s", detail)
        error = BackendUnavailable(detail if public else f"the model server is unavailable; retry in {retry} s")
        error.retry_after_s = retry
        return error


def triton_words(message: str) -> str:
    """Triton's message without the ``[request id: ...]`` it puts first, which names Triton's request, not ours."""
    if message.startswith("[request id:"):
        return message.partition("] ")[2] or message
    return message


def is_model_state(message: str) -> bool:
    return "not at ready state" in message or "is not ready" in message
