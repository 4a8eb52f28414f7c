"""What the data plane tells the traces and the inference log about a request, in one place: the data plane holds
an ``Observer`` only while tracing or the inference log is on, and calls it at the points it reaches anyway (routed
and served, failed, refused, waiting at the model's concurrency gate)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol

from services.gateway.errors import GatewayError
from services.gateway.inference_log.records import Exchange
from services.gateway.inference_log.writer import InferenceLog
from services.gateway.tensors.types import InferRequest, InferResponse
from services.gateway.tracing.spans import CURRENT, RequestTrace, Tracing


class Gate(Protocol):
    """A model's concurrency gate (``shaping.concurrency.ModelGate``), as far as a wait at it is recorded."""

    async def enter(self, rank: int, deadline: float | None) -> None: ...


Header = Callable[[str], str | None]
"""Reads one of the request's headers (gRPC: metadata) by its lower-case name."""
REPLAY_HEADER = "x-switchyard-replay"
"""Set by ``switchyard replay`` on the requests it sends again: they are in the log already. The log leaves out every
request whose headers, as the data plane reads them, carry it (``unlogged``)."""


def _replayed(header: Header | None) -> bool:
    return header is not None and header(REPLAY_HEADER) is not None


def unlogged(header: Header) -> Header:
    """``header`` for a request the inference log must leave out whatever it was sent with (the generate routes'):
    it answers ``REPLAY_HEADER``, so the one check every logged request makes anyway skips it and ``/infer`` pays
    nothing for the distinction."""

    def read(name: str) -> str | None:
        return "unlogged" if name == REPLAY_HEADER else header(name)

    return read


CanaryOf = Callable[[str], int | None]
"""The version the routing's canary split sends requests to (``None``: no canary), to tell a canary's answer from a
stable one's."""


class Observer:
    def __init__(self, tracing: Tracing | None, log: InferenceLog | None, canary_of: CanaryOf) -> None:
        self.tracing = tracing
        self.log = log
        self._canary_of = canary_of

    def close(self, timeout_s: float) -> None:
        """At shutdown: the log writes what it holds (within ``timeout_s``), the traces export theirs."""
        if self.log is not None:
            self.log.close(timeout_s)
        if self.tracing is not None:
            self.tracing.close()

    def current(self) -> RequestTrace | None:
        return CURRENT.get() if self.tracing is not None else None

    def exemplar(self) -> dict[str, str] | None:
        trace = self.current()
        return None if trace is None else trace.exemplar

    def route(self, request: InferRequest, version: int | None) -> str | None:
        """How the request reached its version: ``pinned`` (the client named it), ``stable`` or ``canary``. Read when
        the answer goes out, by the canary split, not the stable version: an activation that flips while a request is
        in flight leaves the request's version other than the new stable one, and it was routed as stable all the
        same (only a canary promoted meanwhile reads as stable)."""
        if version is None:
            return None
        if request.version is not None:
            return "pinned"
        return "canary" if self._canary_of(request.model) == version else "stable"

    def refused(self, error: GatewayError) -> None:
        """Any counted failure (at the edge or in the data plane): the server span gets its status and reason."""
        trace = self.current()
        if trace is None:
            return
        trace.status = error.status
        attributes: dict[str, str] = {}
        if error.reason is not None:
            trace.reason = error.reason
        if error.request_id is not None:
            attributes["switchyard.request_id"] = error.request_id
        if attributes:
            trace.set(attributes)

    async def gate_wait(self, gate: Gate, priority: int, deadline: float | None) -> None:
        """Wait at the model's concurrency gate, recorded as the request's admission wait."""
        trace = self.current()
        if trace is None:
            await gate.enter(priority, deadline)
            return
        began = time.monotonic()
        try:
            await gate.enter(priority, deadline)
        finally:
            trace.child("admission wait", began, time.monotonic(), {"switchyard.priority": priority})

    def served(
        self, request: InferRequest, response: InferResponse, version: int, protocol: str, started: float,
        elapsed: float, header: Header | None = None,
    ) -> None:
        route = self.route(request, version)
        trace = self._routed(request, version, route)
        log = self.log
        if log is not None and log.wants(request.model) and not _replayed(header):
            log.offer(self._exchange(request, response, 200, None, version, route, protocol, started, elapsed, trace))

    def failed(
        self, request: InferRequest, version: int | None, protocol: str, started: float, error: GatewayError,
        header: Header | None = None,
    ) -> None:
        route = self.route(request, version)
        trace = self._routed(request, version, route)
        log = self.log
        if log is not None and log.wants(request.model) and not _replayed(header):
            elapsed = time.perf_counter() - started
            exchange = self._exchange(
                request, None, error.status, str(error), version, route, protocol, started, elapsed, trace
            )
            log.offer(exchange)

    def streamed(self, request: InferRequest, version: int | None) -> None:
        """A decoupled request's end, served or failed: its span names the version and route as a unary request's
        does. The inference log leaves it out: an exchange there holds one answer, not a sequence."""
        self._routed(request, version, self.route(request, version))

    def shadow_trace(self, model: str, version: int) -> RequestTrace | None:
        """A shadow call's own trace, linked to the request it copies (the task's current trace, inherited from the
        request that started it), made current for the call's stages."""
        tracing = self.tracing
        if tracing is None:
            return None
        primary = CURRENT.get()
        attributes = {"switchyard.model": model, "switchyard.version": version, "switchyard.route": "shadow"}
        trace = tracing.linked("shadow infer", [] if primary is None else [primary], attributes)
        CURRENT.set(trace)  # in the shadow's own task: the request's context is a copy
        return trace

    def shadowed(
        self, request: InferRequest, response: InferResponse | None, version: int, started: float,
        error: GatewayError | None, trace: RequestTrace | None,
    ) -> None:
        """A shadow call's end: its trace ends, and it is logged with the route ``shadow`` (when sampled)."""
        status = 200 if error is None else error.status
        if trace is not None:
            trace.end(status)
        log = self.log
        if log is not None and log.wants(request.model):
            elapsed = time.perf_counter() - started
            text = None if error is None else str(error)
            log.offer(self._exchange(request, response, status, text, version, "shadow", "shadow", started, elapsed,
                                     trace))

    def _routed(self, request: InferRequest, version: int | None, route: str | None) -> RequestTrace | None:
        trace = self.current()
        if trace is not None and version is not None:
            trace.set(
                {"switchyard.version": version, "switchyard.route": route or "", "switchyard.tenant": request.tenant}
            )
        return trace

    @staticmethod
    def _exchange(
        request: InferRequest, response: InferResponse | None, status: int, error: str | None, version: int | None,
        route: str | None, protocol: str, started: float, elapsed: float, trace: RequestTrace | None,
    ) -> Exchange:
        arrived = time.time() - (time.perf_counter() - started)
        request_id = trace.span_id if trace is not None else os.urandom(8).hex()
        return Exchange(
            request=request, response=response, status=status, error=error, version=version, route=route,
            protocol=protocol, arrived=arrived, latency_s=elapsed, request_id=request_id,
            trace_id=trace.trace_id if trace is not None else None,
        )
