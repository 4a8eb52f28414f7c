"""Shadow traffic: a sample of a model's unversioned requests also runs on the shadow version once the client's
answer is ready; the shadow's answer is compared with it and dropped. Bounded: beyond ``max_pending`` shadow
requests in flight new ones are dropped and counted, so shadowing never queues work behind the stable path."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import numpy as np

from services.gateway.backends.base import Backend
from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.state.policies import ShadowPolicy
from services.gateway.tensors.bytes_codec import OBJECT, differing
from services.gateway.tensors.types import Array, InferRequest, InferResponse, VersionState
from services.gateway.tracing.observe import Observer
from services.gateway.versions.leases import Leases

log = logging.getLogger(__name__)


class ShadowRunner:
    def __init__(self, backend: Backend, leases: Leases, metrics: GatewayMetrics, max_pending: int) -> None:
        self._backend = backend
        self._leases = leases
        self._metrics = metrics
        self._max_pending = max_pending
        self._pending: set[asyncio.Task[None]] = set()
        self.observer: Observer | None = None
        """Traces and the inference log (set by the app when either is on): a shadow call is a trace of its own,
        linked to the request it copies, and a record with the route ``shadow``."""
        self.prefetch: Callable[[str, int], None] | None = None
        """The model cache's background load, for a shadow version that is not loaded (set by the app)."""

    def offer(self, policy: ShadowPolicy, request: InferRequest, answer: InferResponse) -> None:
        """Called on the hot path after an unversioned answer: samples, and starts the shadow run without
        waiting for it."""
        if random.random() >= policy.sample:
            return
        model = request.model
        if len(self._pending) >= self._max_pending:
            self._metrics.shadow_requests.labels(model, "dropped").inc()
            return
        state = self._backend.state(model, policy.version)
        if state is not VersionState.READY:
            if state is None and self.prefetch is not None:
                self.prefetch(model, policy.version)  # the model cache loads it for the copies that follow
            self._metrics.shadow_requests.labels(model, "unavailable").inc()
            return
        task = asyncio.get_running_loop().create_task(self._run(policy.version, request, answer))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def _run(self, version: int, request: InferRequest, answer: InferResponse) -> None:
        model = request.model
        observer = self.observer
        trace = None if observer is None else observer.shadow_trace(model, version)
        started = time.perf_counter()
        self._leases.acquire(model, version)  # the shadow version must not be unloaded under this request
        try:
            shadow = await self._backend.infer(request, version=version, timeout_s=None, priority=0)
        except GatewayError as exc:
            self._metrics.shadow_requests.labels(model, "failed").inc()
            log.debug("shadow request to model '%s' version %d failed: %s", model, version, exc)
            if observer is not None:
                observer.shadowed(request, None, version, started, exc, trace)
            return
        finally:
            self._leases.release(model, version)
        if observer is not None:
            observer.shadowed(request, shadow, version, started, None, trace)
        served = {output.name: output.data for output in answer.outputs}
        divergence, disagreements = compare(served, {output.name: output.data for output in shadow.outputs})
        self._metrics.shadow_requests.labels(model, "ok").inc()
        self._metrics.shadow_divergence.labels(model).observe(divergence)
        if disagreements:
            self._metrics.shadow_argmax_disagreements.labels(model).inc(disagreements)


def compare(served: dict[str, Array], shadow: dict[str, Array]) -> tuple[float, int]:
    """The largest |served - shadow| over the outputs both have (inf when shapes differ or values are not
    finite; for BYTES outputs, which have no distance, 0 when equal and inf when a string differs), and how many
    rows of a classifier-like output (floats, rows of several scores) pick another argmax."""
    worst, disagreements = 0.0, 0
    for name, value in served.items():
        other = shadow.get(name)
        if other is None or other.shape != value.shape:
            return float("inf"), disagreements
        if value.size == 0:
            continue
        if value.dtype == OBJECT or other.dtype == OBJECT:
            if value.dtype != other.dtype or differing(value, other):
                return float("inf"), disagreements
            continue
        difference = float(np.max(np.abs(value.astype(np.float64) - other.astype(np.float64))))
        worst = max(worst, difference if np.isfinite(difference) else float("inf"))
        if value.dtype.kind == "f" and value.ndim == 2 and value.shape[1] > 1:
            disagreements = max(disagreements, int(np.sum(value.argmax(axis=1) != other.argmax(axis=1))))
    return worst, disagreements
