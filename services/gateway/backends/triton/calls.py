"""Inference calls to Triton: the generated ``ModelInfer`` stub with the request's deadline and priority (a decoupled
model's ``ModelStreamInfer``, ``streams.py``), a cap on calls in flight, and the circuit breaker in front."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from services.gateway.backends.circuit import CircuitBreaker
from services.gateway.backends.triton.channels import TritonChannels
from services.gateway.backends.triton.codec import infer_request, infer_response
from services.gateway.backends.triton.errors import TritonErrors
from services.gateway.backends.triton.http_codec import http_request, http_response
from services.gateway.backends.triton.http_pool import HttpPool
from services.gateway.backends.triton.streams import read_responses, stream_request
from services.gateway.errors import DeadlineExceeded, GatewayError, Overloaded
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from services.gateway.tensors.types import InferRequest, InferResponse
from services.gateway.tracing.spans import CURRENT, failed


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
        self.http: HttpPool | None = None
        """Set by the backend when inference goes over HTTP (``triton_http_url``)."""
        self._host = settings.triton_http_url.encode()
        self.traced = False
        """Set by the app when tracing is on: each call is a client span whose context Triton receives."""

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        trace = CURRENT.get() if self.traced else None
        if trace is None or not trace.sampled:
            # Triton traces every request that carries a trace context, sampled flag or not: only a recorded
            # request's context goes to it, so Triton records what the gateway records.
            return await self._infer(request, version, timeout_s, priority, None)
        transport = "grpc" if self.http is None or self._settings.triton_shared_memory else "http"
        span, carried = trace.client(
            "triton infer", {"switchyard.model": request.model, "switchyard.version": version,
                             "switchyard.triton_transport": transport}
        )
        try:
            return await self._infer(request, version, timeout_s, priority, carried)
        except BaseException as exc:
            failed(span, exc)
            raise
        finally:
            span.end()

    async def _infer(
        self, request: InferRequest, version: int, timeout_s: float | None, priority: int,
        carried: dict[str, str] | None,
    ) -> InferResponse:
        """``carried``: the trace context for Triton (``traceparent``), whose own spans then nest under the call's."""
        channels = self._admit(request, timeout_s)
        forward = self._settings.triton_shared_memory
        http = self.http
        if http is not None and not forward:
            return await self._over_http(http, request, version, timeout_s, priority, carried)
        metadata = None if carried is None else tuple(carried.items())
        message = infer_request(request, version, timeout_s, priority, forward=forward)
        self._inflight += 1
        started = time.monotonic()
        try:
            if timeout_s is not None:
                # The client timeout ends the call on our side when Triton's own queue timeout does.
                reply = await channels.infer(message, timeout=timeout_s, metadata=metadata)
            else:
                # No deadline: only a safety net against a Triton that accepts calls and never answers. A gRPC
                # deadline would cost a timer in gRPC core here and in Triton on every call; the loop's is cheap.
                async with asyncio.timeout(self._settings.triton_infer_timeout_s):
                    reply = await channels.infer(message, metadata=metadata)
        except TimeoutError:
            raise self._silent(request) from None
        except grpc.RpcError as exc:
            raise self._errors.rpc_error(exc, request.model, version, timeout_s) from None
        except OSError as exc:
            raise self._unreachable(exc) from None
        finally:
            self._inflight -= 1
        self._succeeded(request, version, started)
        return infer_response(reply, request, version, forward=forward)

    async def stream(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> AsyncIterator[InferResponse]:
        """A decoupled model's responses (``streams.py``), behind the same breaker and cap as ``infer``: a stream is
        one call in flight for its whole life. Always over gRPC (Triton's HTTP front end refuses decoupled models)
        and with the tensors' bytes in the message (responses cannot share one output region)."""
        channels = self._admit(request, timeout_s)
        call = channels.stream(timeout=timeout_s)
        self._inflight += 1
        started = time.monotonic()
        told = final = False  # whether a response told the breaker Triton is up; whether Triton is done with the call
        try:
            await call.write(stream_request(request, version, timeout_s, priority))
            await call.done_writing()  # one request per call: Triton ends the call after its final response
            responses = read_responses(
                call, request, version, errors=self._errors, timeout_s=timeout_s,
                silence_s=self._settings.triton_infer_timeout_s,
            )
            async for response in responses:
                if not told:
                    told = True
                    self._breaker.record_success()  # Triton answered: it is up, whatever comes next
                if response.final:
                    final = True
                    self._succeeded(request, version, started)
                yield response
        except grpc.RpcError as exc:  # the write failed: Triton refused or dropped the call before any response
            raise self._errors.rpc_error(exc, request.model, version, timeout_s) from None
        except OSError as exc:
            raise self._unreachable(exc) from None
        finally:
            self._inflight -= 1
            if not told:  # a trial call must not stay in flight; an error above has told the breaker what it means
                self._breaker.release()
            if not final:  # failed, or nobody reads on: Triton cancels the request instead of answering into the void
                call.cancel()

    def _admit(self, request: InferRequest, timeout_s: float | None) -> TritonChannels:
        """The channels for one more call, or why there is none: no time left, circuit open, too many in flight."""
        if timeout_s is not None and timeout_s <= 0:
            raise DeadlineExceeded(f"request to model '{request.model}' has no time left for Triton")
        breaker, channels = self._breaker, self.channels
        if channels is None or not breaker.allow():
            raise self._errors.unavailable(f"Triton at {self._settings.triton_url} is unavailable (circuit open)")
        if self._inflight >= self._settings.triton_max_inflight:
            breaker.release()
            raise Overloaded(f"{self._inflight} requests are already in flight to Triton")
        return channels

    async def _over_http(
        self, http: HttpPool, request: InferRequest, version: int, timeout_s: float | None, priority: int,
        carried: dict[str, str] | None,
    ) -> InferResponse:
        head, parts = http_request(request, version, timeout_s, priority, self._host)
        if carried:  # the trace context as headers, before the head's closing blank line
            head = head[:-2] + b"".join(f"{name}: {value}\r\n".encode("latin-1") for name, value in carried.items())
            head += b"\r\n"
        self._inflight += 1
        started = time.monotonic()
        try:
            # One timer either way: the request's deadline (Triton gets it as its queue timeout too), or the
            # safety net against a Triton that never answers.
            limit = timeout_s if timeout_s is not None else self._settings.triton_infer_timeout_s
            async with asyncio.timeout(limit):
                reply = await http.call(head, parts)
        except TimeoutError:
            if timeout_s is None:
                raise self._silent(request) from None
            self._breaker.release()
            raise DeadlineExceeded(
                f"request to model '{request.model}' version {version} did not finish within its "
                f"{timeout_s * 1e3:.1f} ms deadline"
            ) from None
        except OSError as exc:
            raise self._unreachable(exc) from None
        finally:
            self._inflight -= 1
        answer = http_response(reply.status, reply.header_length, reply.body, request, version)
        if isinstance(answer, tuple):
            code, message = answer
            raise self._errors.infer_error(code, message, request.model, version, timeout_s)
        self._succeeded(request, version, started)
        return answer

    def _succeeded(self, request: InferRequest, version: int, started: float) -> None:
        self._breaker.record_success()
        if self._metrics is not None:
            self._metrics.backend_time(request.model, str(version)).observe(time.monotonic() - started)

    def _silent(self, request: InferRequest) -> DeadlineExceeded:
        self._breaker.record_failure()  # a Triton that sits on a call this long is not healthy
        limit = self._settings.triton_infer_timeout_s
        return DeadlineExceeded(f"Triton did not answer model '{request.model}' within {limit:g} s")

    def _unreachable(self, exc: OSError) -> GatewayError:
        self._breaker.record_failure()
        return self._errors.unavailable(f"Triton at {self._settings.triton_url} is unreachable: {exc}")
