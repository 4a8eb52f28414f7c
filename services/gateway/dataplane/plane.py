"""``DataPlane``: readiness, metadata and inference over a ``Backend``, shared by REST and gRPC; its streamed
requests are ``decoupled.py``'s (a mixin). Every request is routed (``Router``) and holds a lease on its version
(``Leases``) until its answer is ready."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from tritonclient.grpc import model_config_pb2

from services.gateway.backends.base import Backend
from services.gateway.capacity.cache import ModelCache
from services.gateway.capacity.demand import route_cold
from services.gateway.dataplane.decoupled import StreamedRequests
from services.gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    unexpected,
    version_not_ready,
)
from services.gateway.metrics import OTHER, GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.shaping.concurrency import ModelGate
from services.gateway.shaping.keys import ANONYMOUS
from services.gateway.shaping.shaper import Shaper
from services.gateway.statistics import Hops, StatisticsReport, gather_statistics
from services.gateway.tensors.classification import LabelsCache, check_classes, classify
from services.gateway.tensors.parameters import check_request_parameters
from services.gateway.tensors.regions import check_room, detach, place_outputs
from services.gateway.tensors.shared_memory import SharedMemoryRegions
from services.gateway.tensors.types import InferOutput, InferRequest, InferResponse, ModelMetadata, VersionState
from services.gateway.tensors.validation import validate
from services.gateway.tracing.observe import Observer
from services.gateway.versions.leases import Leases
from services.gateway.versions.node import NodeFigures
from services.gateway.versions.numbers import parse_version
from services.gateway.versions.routing import ColdVersion, Header, Router
from services.gateway.versions.shadow import ShadowRunner
from services.gateway.versions.windows import TrafficWindows

log = logging.getLogger(__name__)
SERVER_NAME = "switchyard"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "model_repository", "statistics")
FORWARDED_EXTENSIONS = ("parameters", "sequence")
"""Listed when the backend hands request parameters to the model server (Triton: its sequence batcher too)."""


class DataPlane(StreamedRequests):
    def __init__(
        self,
        catalog: Catalog,
        backend: Backend,
        router: Router,
        leases: Leases,
        metrics: GatewayMetrics,
        windows: TrafficWindows,
        shadows: ShadowRunner,
        shaper: Shaper,
        regions: SharedMemoryRegions | None = None,
    ) -> None:
        self.catalog = catalog
        self.backend = backend
        self.router = router
        self.leases = leases
        self.metrics = metrics
        self.windows = windows
        self.shadows = shadows
        self.shaper = shaper
        self.hops = Hops()
        self.regions = regions if regions is not None else SharedMemoryRegions(enabled=False)
        """The clients' shared-memory regions (the extension is off unless the app passes an enabled registry)."""
        self._timed_by_backend: bool = getattr(backend, "enforces_deadlines", False)  # test doubles may not say
        self._forwards_parameters: bool = getattr(backend, "forwards_parameters", False)
        self._decoupled: Callable[[str], bool] = getattr(backend, "decoupled", _answers_once)  # test doubles too
        self._class_labels = LabelsCache()
        self._stream_series: dict[tuple[str, int], tuple[Any, Any]] = {}
        self.node: NodeFigures | None = None
        """The node's other workers (``serve --workers N``): readiness, metrics and statistics answer for the node."""
        self.cache: ModelCache | None = None
        """The model cache (``SWITCHYARD_MODEL_CACHE_MB``): versions loaded on demand, the least recently used
        unloaded to make room."""
        self.observer: Observer | None = None
        """Traces and the inference log (``tracing/observe.py``), when either is on: the request path reads this one
        ``None`` otherwise."""

    async def live(self) -> bool:
        """The gateway answering is its liveness. A dead backend makes it unready, not dead: a liveness
        probe must not restart a healthy gateway while Triton restarts."""
        return True

    async def ready(self) -> bool:
        """This worker ready (``ready_here``), and with several workers every other one too: the node's answer."""
        return await self.ready_here() and (self.node is None or await self.node.ready())

    async def ready_here(self) -> bool:
        """Ready when the backend is live and every model has settled: its stable version serves, or it failed
        for a reason waiting will not fix (logged, and told on ``/v2/models/{m}/ready``). One broken model must
        not keep a multi-model gateway out of its load balancer; a model still loading does."""
        if not await self.backend.live():
            return False
        router = self.router
        return all(router.ready(model) or router.problem(model) is not None for model in self.catalog.entries)

    def server_metadata(self) -> dict[str, object]:
        forwarded = FORWARDED_EXTENSIONS if self._forwards_parameters else ()
        extensions = [*EXTENSIONS, *forwarded, *self.regions.extensions]
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": extensions}

    def resolve(self, model: str, version: int | None) -> int:
        """The version a request is served by; 404 when unknown, 503 when it exists but is not ready."""
        return self.router.route(model, version)

    async def model_ready(self, model: str, version: int | None) -> bool:
        return await self.model_readiness(model, version) is None

    async def model_readiness(self, model: str, version: int | None) -> str | None:
        """``None`` when the model (version) answers requests now, else why not."""
        try:
            served = self.resolve(model, version)
        except ColdVersion:
            return None  # loaded on its first request: it answers requests now
        except ModelNotReady as exc:
            return str(exc)
        if await self.backend.ready(model, served):
            return None
        return str(version_not_ready(model, served, "its model server does not report it ready"))

    async def model_metadata(self, model: str, version: int | None) -> ModelMetadata:
        try:
            served = self.resolve(model, version)
        except ColdVersion as cold:  # answered from the repository, without loading it
            return self.catalog.entry(model).metadata((cold.routed,))
        metadata = await self.backend.metadata(model, served)
        if version is None:  # like Triton: the unversioned answer lists every ready version
            versions = self.backend.models().get(model, {})
            ready = tuple(sorted(v for v, s in versions.items() if s is VersionState.READY))
            metadata = dataclasses.replace(metadata, versions=ready)
        return metadata

    async def model_config(self, model: str, version: int | None) -> model_config_pb2.ModelConfig:
        try:
            return await self.backend.config(model, self.resolve(model, version))
        except ColdVersion:  # answered from the repository, without loading it
            config = model_config_pb2.ModelConfig()
            config.CopyFrom(self.catalog.entry(model).config)
            return config

    async def statistics(self, model: str, version: int | None) -> StatisticsReport:
        """The statistics extension: ``model`` empty for every model, ``version`` ``None`` for every ready one; the
        node's figures with several workers."""
        local = await self.statistics_here(model, version)
        return local if self.node is None else await self.node.statistics(local, model, version)

    async def statistics_here(self, model: str, version: int | None) -> StatisticsReport:
        return await gather_statistics(self.catalog.entries, self.backend, self.hops, model, version)

    async def infer(self, request: InferRequest, *, protocol: str, header: Header | None = None) -> InferResponse:
        """``header`` reads the request's headers (gRPC: metadata), for a sticky canary split. The front end has
        run the checks that come before validation (body size, API key, rate limit) and set the deadline."""
        started = time.perf_counter()
        model = request.model
        watched = request.version is None and model in self.windows.watched
        version: int | None = None
        observer = self.observer
        try:
            try:
                version = self._routed(request, header)
            except ColdVersion as cold:  # the model cache loads it for this request
                version = await route_cold(self.cache, self.router, cold, request, header)
            request.routed = version
            quota = request.quota
            if quota is not None:
                quota.take()  # the key's own share first: a key over it takes none of the model's slots
            # Admitted: from here until the answer is ready the version cannot be drained away (a request waiting
            # for a concurrency slot holds it too: it will be served by the version it was routed to).
            leases = self.leases
            leases.acquire(model, version)  # a counter: it cannot fail between the take and the try
            try:
                metadata = await self.backend.metadata(model, version)
                validate(request, metadata)
                if request.parameters:
                    await self._check_parameters(request, version)
                if request.classification:
                    check_classes(request.classification, metadata)
                if request.output_regions:
                    check_room(request, metadata)  # before the model runs, when the shapes tell
                response, backend_seconds = await self._admitted(request, version)
                if request.classification:
                    await self._classify(request, metadata, response, version)
            finally:
                leases.release(model, version)
                if quota is not None:
                    quota.give_back()
            if request.outputs is not None:
                response.outputs = self._select(request, response)
            if request.output_regions:
                place_outputs(request, response.outputs)
        except Exception as exc:
            error = self._failed(exc, request, version, protocol, watched, started)
            if observer is not None:
                observer.failed(request, version, protocol, started, error, header)
            if error is exc:
                raise
            raise error from exc
        elapsed = time.perf_counter() - started
        self._succeeded(request, version, protocol, watched, elapsed, backend_seconds)
        if observer is not None:
            observer.served(request, response, version, protocol, started, elapsed, header)
        if request.version is None:
            record = self.router.record(model)
            if record is not None and record.shadow is not None and version == record.stable:
                self.shadows.offer(record.shadow, *detach(request, response))
        return response

    def _routed(self, request: InferRequest, header: Header | None) -> int:
        """The version the router sends ``request`` to, the model marked as used for the model cache; raises
        ``ColdVersion`` when the cache has to load it first (``capacity.demand.route_cold``)."""
        version = self.router.route(request.model, request.version, header)
        if self.cache is not None:
            self.cache.touch(request.model)
        return version

    def record_error(
        self, model: str, version: int | str | None, protocol: str, error: GatewayError, tenant: str = ANONYMOUS
    ) -> None:
        """Count a failed request; front ends call it for errors raised before ``infer`` (framing, API key, rate
        limit). Labels come only from models and versions the repository knows (and the API keys' tenants): a
        client inventing names must not grow the metrics."""
        model_label, version_label = self._labels(model, version)
        self.metrics.requests.labels(model_label, version_label, protocol, str(error.status)).inc()
        self.metrics.tenant(tenant, str(error.status)).inc()
        if error.reason is not None:
            self.metrics.rejected.labels(model_label, error.reason).inc()
        if self.observer is not None:
            self.observer.refused(error)

    def _failed(
        self, exc: Exception, request: InferRequest, version: int | None, protocol: str, watched: bool, started: float
    ) -> GatewayError:
        """Count a request that failed after it reached the dataplane; the error to raise in its place."""
        model = request.model
        error = self._client_error(exc, model, version)
        if type(error) is ModelNotFound and version is not None and request.version is None:
            error = self._unloaded_under(model, version, error)
        served = version if version is not None else request.version
        self.record_error(model, served, protocol, error, request.tenant)
        if version is not None:
            error.version = version  # the answer names the version that failed (a canary's, say)
            self.hops.failed(model, version, time.perf_counter() - started)
            if watched:
                self.windows.observe(model, version, error.status, time.perf_counter() - started)
        return error

    def _succeeded(
        self, request: InferRequest, version: int, protocol: str, watched: bool, elapsed: float, backend_seconds: float
    ) -> None:
        """Count a served request: its hop, its status and duration, its tenant, the canary's window."""
        model = request.model
        self.hops.served(model, version, elapsed, backend_seconds)
        series = self.metrics.served(model, version, protocol)
        series.ok.inc()
        observer = self.observer
        exemplar = None if observer is None else observer.exemplar()
        if exemplar is None:
            series.duration.observe(elapsed)
        else:  # the latency bucket names a recorded trace: a dashboard jumps from a slow bucket to its trace
            series.duration.observe(elapsed, exemplar)
        self.metrics.tenant(request.tenant, "200").inc()
        if watched:
            self.windows.observe(model, version, 200, elapsed)

    def _queue_gate(self, request: InferRequest) -> ModelGate | None:
        """The model's concurrency gate to wait at (``None``: no cap), once the deadline allows queueing."""
        deadline = request.deadline
        if deadline is not None and time.monotonic() >= deadline:
            raise self._expired(request, "before it could be queued")
        return self.shaper.gate(request.model)

    def _labels(self, model: str, version: int | str | None) -> tuple[str, str]:
        entry = self.catalog.entries.get(model)
        if entry is None:
            return OTHER, ""
        if version is None or version == "":
            return model, ""
        number = version if isinstance(version, int) else _known_number(version)
        if number is not None and (number in entry.available or self.backend.state(model, number) is not None):
            return model, str(number)
        return model, OTHER

    def _unloaded_under(self, model: str, version: int, error: ModelNotFound) -> GatewayError:
        """An unversioned request routed to ``version``, which was unloaded before the request reached it (a switch
        whose drain did not wait for it: a drain timeout of 0, or one that ran out): the client asked for no version,
        so "version N is not found" would misdirect it; the model serves another one now, so a retry is answered."""
        if self.router.routes_to(model, version):  # still routed: the backend lost it, which is another story
            return error
        return ModelNotReady(
            f"model '{model}' version {version}, which this request was routed to, was unloaded before it was "
            "served (a version switch that did not wait for its requests to drain); the model serves another "
            "version now: retry"
        )

    def _client_error(self, exc: Exception, model: str, version: int | None) -> GatewayError:
        """What the client is told. A 500 is a model or gateway failure: its cause goes to the log under a request
        id and the client gets the id, never the runtime's text (it can hold paths, tensors, internals)."""
        if isinstance(exc, GatewayError) and exc.status != 500:
            return exc
        target = f"model '{model}'" if version is None else f"model '{model}' version {version}"
        if not isinstance(exc, GatewayError):  # a bug, not the client's fault: the one answer every edge gives it
            return unexpected(exc, f"a request to {target}")
        request_id = uuid.uuid4().hex[:16]
        log.error("request %s to %s failed: %s", request_id, target, exc, exc_info=exc.__cause__)
        cause = f"the gateway log has the cause (request id {request_id})"
        error = InferenceFailed(f"inference failed on {target}; {cause}")
        error.request_id = request_id
        return error

    async def _admitted(self, request: InferRequest, version: int) -> tuple[InferResponse, float]:
        """Deadline, then the model's concurrency gate, then the backend with what is left of the budget. The
        backend call is timed (returned with the answer): what the gateway adds around it is its hop (``Hops``)."""
        deadline = request.deadline
        gate = self._queue_gate(request)
        if gate is not None:
            if self.observer is None:
                await gate.enter(request.priority, deadline)
            else:
                await self.observer.gate_wait(gate, request.priority, deadline)
        began = time.perf_counter()
        try:
            if deadline is None:
                response = await self.backend.infer(request, version=version, timeout_s=None, priority=request.priority)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._expired(request, "while it waited for a free slot")
                if self._timed_by_backend:
                    response = await self.backend.infer(
                        request, version=version, timeout_s=remaining, priority=request.priority
                    )
                else:
                    async with asyncio.timeout(remaining):
                        response = await self.backend.infer(
                            request, version=version, timeout_s=remaining, priority=request.priority
                        )
        except TimeoutError:
            raise self._expired(request, "") from None
        except DeadlineExceeded:  # the backend's own timer: told like the dataplane's
            if deadline is None or time.monotonic() < deadline:
                raise
            raise self._expired(request, "") from None
        finally:
            if gate is not None:
                gate.leave(time.perf_counter() - began)
        return response, time.perf_counter() - began

    async def _check_parameters(self, request: InferRequest, version: int) -> None:
        """Refuse request parameters the model would not get (``tensors.parameters``): never dropped in silence."""
        forwarded = self._forwards_parameters
        sequence = forwarded and (await self.backend.config(request.model, version)).HasField("sequence_batching")
        check_request_parameters(
            request.parameters, request.model, forwarded=forwarded, sequence_batching=sequence, backend="embedded"
        )

    async def _classify(
        self, request: InferRequest, metadata: ModelMetadata, response: InferResponse, version: int
    ) -> None:
        """Replace each output asked for with ``class_count`` by its top classes, with the version's labels."""
        config = await self.backend.config(request.model, version)
        labels = await self._class_labels.of(request.model, version, config, self.catalog.entry(request.model).path)
        batched = metadata.max_batch_size > 0
        response.outputs = [
            classify(output, request.classification[output.name], labels.get(output.name, ()), batched)
            if output.name in request.classification and output.region is None
            else output
            for output in response.outputs
        ]

    @staticmethod
    def _expired(request: InferRequest, where: str) -> DeadlineExceeded:
        budget = "its" if request.budget_s is None else f"its {format_duration(request.budget_s)}"
        ended = f"passed {where}" if where else "passed before it finished"
        return DeadlineExceeded(f"request to model '{request.model}': {budget} deadline {ended}")

    @staticmethod
    def _select(request: InferRequest, response: InferResponse) -> list[InferOutput]:
        if request.outputs is None:
            return response.outputs
        by_name = {output.name: output for output in response.outputs}
        return [by_name[name] for name in request.outputs]


def _answers_once(model: str) -> bool:
    """A backend that does not say whether a model is decoupled: none is."""
    return False


def format_duration(seconds: float) -> str:
    """``20.0 ms``, ``1 µs``: a deadline as a person reads it (a 1 µs budget must not print as ``0.0 ms``)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1e3:.1f} ms"


def _known_number(version: str) -> int | None:
    """A version label's number when it is one the repository could hold (``versions.parse_version``'s rule);
    ``None`` for anything malformed, which the metrics then count under ``_other``."""
    try:
        return parse_version(version)
    except InvalidInput:
        return None
