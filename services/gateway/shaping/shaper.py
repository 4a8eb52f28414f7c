"""The shaping checks every front end runs, in DESIGN.md's order: API key → rate limit → (validation, by the
dataplane) → deadline → per-model concurrency with priorities → backend. Protocol-neutral: REST and gRPC hand in
the header / metadata values and get ``GatewayError``s back."""

from __future__ import annotations

import math
from collections.abc import Mapping

from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from services.gateway.shaping.admission import AdaptiveLimit, ModelGate
from services.gateway.shaping.deadlines import Deadlines, Priorities
from services.gateway.shaping.keys import ANONYMOUS, ApiKeys, build_api_keys
from services.gateway.shaping.ratelimit import RateLimiter, build_rate_limiter

NO_HEADERS: Mapping[str, str] = {}


class Shaper:
    def __init__(
        self,
        settings: Settings,
        metrics: GatewayMetrics | None = None,
        *,
        keys: ApiKeys | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self._metrics = metrics
        self.keys = keys if keys is not None else build_api_keys(settings)
        self.limiter = limiter if limiter is not None else build_rate_limiter(settings)
        self.protect_metadata = settings.protect_metadata
        self.deadlines = Deadlines(_seconds(settings.default_timeout_ms), _seconds(settings.max_timeout_ms))
        self.priorities = Priorities(settings.priority_levels, settings.default_priority)
        self._concurrency = settings.max_concurrency
        self._queue = settings.max_queue
        self._adaptive = settings.adaptive_concurrency
        self._gates: dict[str, ModelGate] = {}

    def authenticate(self, key: str | None) -> str:
        """The caller's tenant (``anonymous`` when API keys are off); 401 when a key is needed and not valid."""
        if not self.keys.enabled:
            return ANONYMOUS
        return self.keys.authenticate(key)

    def authenticate_metadata(self, key: str | None) -> None:
        """Metadata, readiness and configuration need the key only when ``protect_metadata`` is set."""
        if self.protect_metadata:
            self.authenticate(key)

    async def rate_limit(self, tenant: str, model: str) -> Mapping[str, str]:
        """The ``X-RateLimit-*`` headers for the answer; raises ``RateLimited`` (429) when the bucket is empty."""
        if self.limiter is None:
            return NO_HEADERS
        decision = await self.limiter.check(tenant, model)
        if decision is None:
            return NO_HEADERS
        decision.raise_if_refused()
        return decision.headers()

    def gate(self, model: str) -> ModelGate | None:
        """The model's admission gate (``None``: no concurrency cap). Only models the router knows get one, so
        the gates stay as many as the models."""
        if self._concurrency <= 0:
            return None
        gate = self._gates.get(model)
        if gate is None:
            adaptive = AdaptiveLimit(self._concurrency) if self._adaptive else None
            gate = self._gates[model] = ModelGate(model, self._concurrency, self._queue, adaptive)
            if self._metrics is not None:
                self._metrics.queued.labels(model).set_function(lambda: gate.waiting)
                self._metrics.executing.labels(model).set_function(lambda: gate.inflight)
                self._metrics.concurrency_limit.labels(model).set_function(lambda: gate.limit)
        return gate

    @property
    def gates(self) -> Mapping[str, ModelGate]:
        return self._gates

    async def close(self) -> None:
        if self.limiter is not None:
            await self.limiter.close()


def _seconds(millis: float) -> float | None:
    return millis / 1e3 if millis > 0 and math.isfinite(millis) else None
