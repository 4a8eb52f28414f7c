"""The data plane's streamed requests (``DataPlane.infer_stream``, a mixin of ``DataPlane``): a decoupled model's
many responses to one request, held by one lease and one concurrency slot until the last; a model that answers once
goes through ``infer``, without a generator (a stream's common case)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

from services.gateway.backends.base import Backend
from services.gateway.capacity.cache import ModelCache
from services.gateway.capacity.demand import route_cold
from services.gateway.errors import DeadlineExceeded, GatewayError, InvalidInput
from services.gateway.metrics import GatewayMetrics
from services.gateway.shaping.concurrency import ModelGate
from services.gateway.tensors.classification import check_classes
from services.gateway.tensors.types import InferOutput, InferRequest, InferResponse, ModelMetadata
from services.gateway.tensors.validation import validate
from services.gateway.tracing.observe import Observer
from services.gateway.versions.leases import Leases
from services.gateway.versions.routing import ColdVersion, Header, Router
from services.gateway.versions.windows import TrafficWindows


class _Plane(Protocol):
    """What of ``DataPlane`` a streamed request uses: the class ``StreamedRequests`` mixes into."""

    backend: Backend
    router: Router
    leases: Leases
    metrics: GatewayMetrics
    windows: TrafficWindows
    cache: ModelCache | None
    observer: Observer | None
    _decoupled: Callable[[str], bool]
    _stream_series: dict[tuple[str, int], tuple[Any, Any]]

    def _routed(self, request: InferRequest, header: Header | None) -> int: ...
    async def infer(self, request: InferRequest, *, protocol: str, header: Header | None = None) -> InferResponse: ...
    async def infer_once_streamed(
        self, request: InferRequest, *, protocol: str, header: Header | None = None
    ) -> InferResponse: ...
    def _observe_stream(self, model: str, version: int, started: float, responses: int) -> None: ...
    def _observe_first(self, model: str, version: int, started: float) -> None: ...
    async def _check_streamed(self, request: InferRequest, metadata: ModelMetadata, version: int) -> None: ...
    async def _check_parameters(self, request: InferRequest, version: int) -> None: ...
    def _queue_gate(self, request: InferRequest) -> ModelGate | None: ...
    def _expired(self, request: InferRequest, where: str) -> DeadlineExceeded: ...
    async def _classify(
        self, request: InferRequest, metadata: ModelMetadata, response: InferResponse, version: int
    ) -> None: ...
    def _failed(
        self, exc: Exception, request: InferRequest, version: int | None, protocol: str, watched: bool, started: float
    ) -> GatewayError: ...
    def _succeeded(
        self, request: InferRequest, version: int, protocol: str, watched: bool, elapsed: float, backend_seconds: float
    ) -> None: ...
    def _labels(self, model: str, version: int | str | None) -> tuple[str, str]: ...


class StreamedRequests:
    """``DataPlane``'s streaming part: ``infer_stream`` and what only it uses."""

    async def infer_stream(
        self: _Plane, request: InferRequest, *, protocol: str, header: Header | None = None
    ) -> AsyncGenerator[InferResponse, None]:
        """Every response to one request, in order, the last with ``final`` set: a model that answers once gives one
        (``infer``). Streaming front ends (gRPC ``ModelStreamInfer``, HTTP ``generate_stream``) call this.

        A decoupled model's request takes the steps ``infer`` takes (route, lease, validate, gate, deadline, count
        once), held for its whole sequence: a drain waits for its last response, and its lease keeps the version
        loaded until then. Closing the generator early (``aclose``: the client went away) releases both at once and
        cancels the request in the model server."""
        model = request.model
        if not self._decoupled(model):
            yield await self.infer_once_streamed(request, protocol=protocol, header=header)
            return
        started = time.perf_counter()
        watched = request.version is None and model in self.windows.watched
        version: int | None = None
        count = 0
        try:
            try:
                version = self._routed(request, header)
            except ColdVersion as cold:
                version = await route_cold(self.cache, self.router, cold, request, header)
            request.routed = version
            quota = request.quota
            if quota is not None:
                quota.take()  # held for the whole sequence, as the lease is
            leases = self.leases
            leases.acquire(model, version)
            try:
                metadata = await self.backend.metadata(model, version)
                await self._check_streamed(request, metadata, version)
                gate = self._queue_gate(request)
                if gate is not None:
                    await gate.enter(request.priority, request.deadline)
                began = time.perf_counter()
                try:
                    timeout_s = None if request.deadline is None else request.deadline - time.monotonic()
                    if timeout_s is not None and timeout_s <= 0:
                        raise self._expired(request, "while it waited for a free slot")
                    responses = self.backend.infer_stream(
                        request, version=version, timeout_s=timeout_s, priority=request.priority
                    )
                    async for response in responses:
                        if request.classification and response.outputs:
                            await self._classify(request, metadata, response, version)
                        if request.outputs is not None and response.outputs:
                            response.outputs = _present(request.outputs, response.outputs)
                        if count == 0:
                            self._observe_first(model, version, started)
                        count += 1
                        yield response
                finally:
                    # None: how long a decoupled request runs is the model's pace, not a load the adaptive limit
                    # should react to.
                    if gate is not None:
                        gate.leave(None)
            finally:
                leases.release(model, version)
                if quota is not None:
                    quota.give_back()
        except Exception as exc:
            error = self._failed(exc, request, version, protocol, watched, started)
            if self.observer is not None:
                self.observer.streamed(request, version)
            if error is exc:
                raise
            raise error from exc
        # No shadow copy: a shadow compares one answer, and would double the model's work for every response.
        ended = time.perf_counter()
        self._succeeded(request, version, protocol, watched, ended - started, ended - began)
        if self.observer is not None:
            self.observer.streamed(request, version)
        self.metrics.stream_responses.labels(model).observe(count)

    def decoupled(self: _Plane, model: str) -> bool:
        """Whether ``model`` may send several responses per request (Triton's decoupled transaction policy)."""
        return self._decoupled(model)

    async def infer_once_streamed(
        self: _Plane, request: InferRequest, *, protocol: str, header: Header | None = None
    ) -> InferResponse:
        """``infer_stream`` of a model that answers once, without the generator: a stream's common case, whose
        per-request cost is what a stream is for."""
        started = time.perf_counter()
        response = await self.infer(request, protocol=protocol, header=header)
        self._observe_stream(request.model, response.version, started, 1)
        return response

    def _observe_stream(self: _Plane, model: str, version: int, started: float, responses: int) -> None:
        """A streamed request of a model that answers once: its one response is its first and its last."""
        series = self._stream_series.get((model, version))
        if series is None:  # looked up once per model version: a stream's requests are many and cheap
            model_label, version_label = self._labels(model, version)
            series = self._stream_series[(model, version)] = (
                self.metrics.first_response.labels(model_label, version_label),
                self.metrics.stream_responses.labels(model_label),
            )
        series[0].observe(time.perf_counter() - started)
        series[1].observe(responses)

    def _observe_first(self: _Plane, model: str, version: int, started: float) -> None:
        model_label, version_label = self._labels(model, version)
        self.metrics.first_response.labels(model_label, version_label).observe(time.perf_counter() - started)

    async def _check_streamed(self: _Plane, request: InferRequest, metadata: ModelMetadata, version: int) -> None:
        """``infer``'s checks before the model runs, for a decoupled model's request."""
        validate(request, metadata)
        if request.parameters:
            await self._check_parameters(request, version)
        if request.classification:
            check_classes(request.classification, metadata)
        if request.output_regions:
            raise InvalidInput(
                f"model '{request.model}' is decoupled (many responses per request): its outputs cannot go to "
                "shared memory, where each response would overwrite the last; ask for them in the responses"
            )


def _present(names: tuple[str, ...], outputs: list[InferOutput]) -> list[InferOutput]:
    """The outputs asked for, in the order asked, of those a decoupled model's response carries (it may send some
    outputs in one response and others in the next)."""
    by_name = {output.name: output for output in outputs}
    return [by_name[name] for name in names if name in by_name]


