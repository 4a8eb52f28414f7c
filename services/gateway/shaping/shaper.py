"""The admission step: the checks every front end runs, in one place and in the order of docs/architecture.md
("Admission"): message size → API key → rate limit → (decoding, by the front end) → deadline and priority →
(validation, routing, per-model concurrency, by the dataplane) → backend. REST and gRPC read the values from their
headers or metadata, hand them in, and answer the ``GatewayError`` that comes back; the same request gets the same
decision on both."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from services.gateway.errors import GatewayError, PayloadTooLarge
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from services.gateway.shaping.concurrency import AdaptiveLimit, ModelGate
from services.gateway.shaping.deadlines import Deadlines, Priorities
from services.gateway.shaping.key_quota import KeyQuotas, KeySlots
from services.gateway.shaping.keys import ANONYMOUS, ApiKeys, TooManyVerifications, build_api_keys
from services.gateway.shaping.limits import KeyLimit, LimitTable
from services.gateway.shaping.node_buckets import NodeRateLimiter
from services.gateway.shaping.node_share import NodeShare, NodeSlots
from services.gateway.shaping.ratelimit import LocalRateLimiter, RateLimiter
from services.gateway.shaping.redis_buckets import RedisRateLimiter
from services.gateway.tensors.types import InferRequest

NO_HEADERS: Mapping[str, str] = MappingProxyType({})
ModelFilter = Callable[[str], bool]
"""Whether a caller may see a model (its metadata, readiness, configuration, statistics, index entries)."""
MESSAGE = {"http": "request body", "grpc": "request message"}


@dataclass(slots=True)
class Admitted:
    """What admission has established so far: filled in as the checks pass, so that a refusal is counted against
    the tenant it came from (a rate-limited key's tenant, not ``anonymous``)."""

    tenant: str = ANONYMOUS
    limits: Mapping[str, str] = field(default_factory=dict)
    """The ``X-RateLimit-*`` figures for the answer: REST headers, gRPC trailing metadata."""
    quota: KeySlots | None = None
    """The key's requests-in-flight share, when its entry sets ``concurrency``: the dataplane takes it."""


class Shaper:
    def __init__(
        self,
        settings: Settings,
        metrics: GatewayMetrics | None = None,
        *,
        keys: ApiKeys | None = None,
        limiter: RateLimiter | None = None,
        share: NodeShare | None = None,
    ) -> None:
        """``share``: the node's shared figures (``serve --workers N``): rate limits and concurrency caps hold for
        the node, not for each worker."""
        self._metrics = metrics
        self._share = share
        self.keys = keys if keys is not None else build_api_keys(settings)
        # A structured keys file may give any key a rate of its own at any reload: its gateway keeps a limiter.
        self.limiter = limiter if limiter is not None else build_rate_limiter(settings, share, self.keys.structured)
        self.quotas = KeyQuotas(share, refused=self._key_refused)
        self.protect_metadata = settings.protect_metadata
        self.deadlines = Deadlines(_seconds(settings.default_timeout_ms), _seconds(settings.max_timeout_ms))
        self.priorities = Priorities(settings.priority_levels, settings.default_priority)
        self.max_message_bytes = settings.max_body_bytes
        self._concurrency = settings.max_concurrency
        self._queue = settings.max_queue
        self._adaptive = settings.adaptive_concurrency
        self._gates: dict[str, ModelGate] = {}

    async def admit(
        self, admitted: Admitted, model: str, protocol: str, *, api_key: str | None, size: int | None
    ) -> None:
        """The checks before a request is decoded: its size (the declared ``Content-Length``, or the gRPC message's)
        against ``max_body_bytes`` (413 / ``RESOURCE_EXHAUSTED``), its API key (401), its tenant's rate limit (429).
        A key of the structured keys file calling a model outside its list is 403 (reason ``forbidden``). Fills
        ``admitted`` as each passes; raises the refusal."""
        if size is not None:
            self.check_size(size, protocol)
        if not self.keys.enabled:
            if self.limiter is not None:
                admitted.limits = await self.rate_limit(admitted.tenant, model)
            return
        try:
            access = self.keys.identify(api_key)
        except TooManyVerifications:  # not the key's doing: anyone may write its id before a made-up secret
            raise
        except GatewayError as exc:  # 401
            self._key_refused(self.keys.known_id(api_key), exc.reason)
            raise
        admitted.tenant = access.tenant  # set first: a forbidden call is counted against its tenant
        entry = access.entry
        try:
            access.check(model)
            if self.limiter is not None:
                own = (entry.id, access.limit) if entry is not None and access.limit is not None else None
                admitted.limits = await self.rate_limit(admitted.tenant, model, own)
        except GatewayError as exc:
            self._key_refused(access.key_id, exc.reason)
            raise
        if entry is not None and entry.concurrency is not None:
            admitted.quota = self.quotas.slots(entry.id, entry.concurrency)

    def shape(
        self,
        request: InferRequest,
        admitted: Admitted,
        started: float,
        *,
        timeout: str | None,
        priority: str | None,
        call_remaining_s: float | None = None,
    ) -> None:
        """The checks once the request is decoded: its tenant, its deadline (the shortest of the v2 ``timeout``
        parameter, ``X-Request-Timeout`` / ``x-request-timeout`` in milliseconds and the gRPC call's own deadline,
        cut to ``max_timeout_ms``; ``default_timeout_ms`` when none is named) and its priority rank (the v2
        ``priority`` parameter, else ``X-Priority`` / ``x-priority``, else ``default_priority``)."""
        request.tenant = admitted.tenant
        request.quota = admitted.quota
        budget = self.deadlines.budget(request.timeout_s, timeout, call_remaining_s)
        if budget is not None:
            request.budget_s, request.deadline = budget, started + budget
        if priority is not None or request.priority:
            request.priority = self.priorities.rank(request.priority, priority)
        else:
            request.priority = self.priorities.default

    def _key_refused(self, key_id: str | None, reason: str | None) -> None:
        if key_id is not None and reason is not None and self._metrics is not None:
            self._metrics.key_rejected.labels(key_id, reason).inc()

    def check_size(self, size: int, protocol: str) -> None:
        """The size check alone, for calls that are not inference (repository, shared-memory, metadata)."""
        if size > self.max_message_bytes:
            raise PayloadTooLarge(
                f"{MESSAGE.get(protocol, 'request')} of {size} bytes exceeds the {self.max_message_bytes} byte limit"
            )

    def authenticate(self, key: str | None) -> str:
        """The caller's tenant (``anonymous`` when API keys are off); 401 when a key is needed and not valid."""
        if not self.keys.enabled:
            return ANONYMOUS
        return self.keys.authenticate(key)

    def authenticate_metadata(self, key: str | None, model: str | None = None) -> ModelFilter:
        """Metadata, readiness, configuration and statistics: ``visible_models``, with the key needed only when
        ``protect_metadata`` is set."""
        return self.visible_models(key, model, key_required=self.protect_metadata)

    def visible_models(self, key: str | None, model: str | None = None, *, key_required: bool = False) -> ModelFilter:
        """The models the caller may see: those its key may call. Every model while keys are off, or when no key is
        presented and ``key_required`` is False (open metadata; a repository index the admin token let through).
        A presented key is always checked (401 when unknown or expired); naming a ``model`` the key may not call is
        403, the same refusal as inference's."""
        if not self.keys.enabled or (not key and not key_required):
            return _every_model
        access = self.keys.identify(key)
        if model:
            access.check(model)
        return access.may_call

    async def rate_limit(self, tenant: str, model: str, own: KeyLimit | None = None) -> Mapping[str, str]:
        """The ``X-RateLimit-*`` headers for the answer; raises ``RateLimited`` (429) when the bucket is empty.
        ``own``: the API key's own limit (its id and limit), from the keys file."""
        if self.limiter is None:
            return NO_HEADERS
        decision = await self.limiter.check(tenant, model, own)
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
            node = NodeSlots(self._share, model) if self._share is not None else None
            gate = self._gates[model] = ModelGate(model, self._concurrency, self._queue, adaptive, node=node)
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


def _every_model(model: str) -> bool:
    return True


def _seconds(millis: float) -> float | None:
    return millis / 1e3 if millis > 0 and math.isfinite(millis) else None


def build_rate_limiter(
    settings: Settings, share: NodeShare | None = None, keys_may_limit: bool = False
) -> RateLimiter | None:
    """None when no rule limits anything (and ``keys_may_limit`` is False: no keys file that could give a key a
    rate of its own); shared through Redis when ``redis_url`` is set (replicas share their buckets as they share
    the routing), else by the node's workers (``share``), else per process. Raises ``LimitsError`` on invalid
    limits."""
    table = LimitTable(settings.rate_limit_rps, settings.rate_limit_burst, settings.limits_file)
    if not table.limited and not keys_may_limit:
        return None
    if settings.redis_url is not None:
        return RedisRateLimiter(settings.redis_url, settings.redis_prefix, table)
    if share is not None:
        return NodeRateLimiter(table, share)
    return LocalRateLimiter(table)
