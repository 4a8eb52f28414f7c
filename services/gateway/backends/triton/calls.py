"""Inference calls to Triton: the generated ``ModelInfer`` stub with the request's deadline and priority, a cap on
calls in flight, and the circuit breaker in front."""

from __future__ import annotations

import asyncio
import time

import grpc

from services.gateway.backends.circuit import CircuitBreaker
from services.gateway.backends.triton.channels import TritonChannels
from services.gateway.backends.triton.codec import infer_request, infer_response
from services.gateway.backends.triton.errors import TritonErrors
from services.gateway.errors import DeadlineExceeded, Overloaded
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from services.gateway.types import InferRequest, InferResponse


class TritonCalls:
    def __init__(
        self, breaker: CircuitBreaker, errors: TritonErrors, settings: Settings, metrics: GatewayMetrics | None
    ) -> None:
        self._breaker = breaker
        self._errors = errors
        self._settings = settings
        self._metrics = metrics
        self._inflight = 0
        self.channels: TritonChannels | None = None
        """Set by the backend once connected, cleared when it closes."""

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        if timeout_s is not None and timeout_s <= 0:
            raise DeadlineExceeded(f"request to model '{request.model}' has no time left for Triton")
        breaker, channels = self._breaker, self.channels
        if channels is None or not breaker.allow():
            raise self._errors.unavailable(f"Triton at {self._settings.triton_url} is unavailable (circuit open)")
        if self._inflight >= self._settings.triton_max_inflight:
            breaker.release()
            raise Overloaded(f"{self._inflight} requests are already in flight to Triton")
        forward = self._settings.triton_shared_memory
        message = infer_request(request, version, timeout_s, priority, forward=forward)
        self._inflight += 1
        started = time.monotonic()
        try:
            if timeout_s is not None:
                # The client timeout ends the call on our side when Triton's own queue timeout does.
                reply = await channels.infer(message, timeout=timeout_s)
            else:
                # No deadline: only a safety net against a Triton that accepts calls and never answers. A gRPC
                # deadline would cost a timer in gRPC core here and in Triton on every call; the loop's is cheap.
                async with asyncio.timeout(self._settings.triton_infer_timeout_s):
                    reply = await channels.infer(message)
        except TimeoutError:
            breaker.record_failure()  # a Triton that sits on a call this long is not healthy
            limit = self._settings.triton_infer_timeout_s
            raise DeadlineExceeded(f"Triton did not answer model '{request.model}' within {limit:g} s") from None
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            raise self._errors.infer_error(code, str(details or ""), request.model, version, timeout_s) from None
        except OSError as exc:
            breaker.record_failure()
            raise self._errors.unavailable(f"Triton at {self._settings.triton_url} is unreachable: {exc}") from None
        finally:
            self._inflight -= 1
        breaker.record_success()
        if self._metrics is not None:
            self._metrics.backend_time(request.model, str(version)).observe(time.monotonic() - started)
        return infer_response(reply, request, version, forward=forward)
