"""Token buckets: how often a tenant may call. ``LocalRateLimiter`` keeps them in this process (redis_buckets.py
shares them between replicas); both answer a ``Decision`` that becomes the ``X-RateLimit-*`` headers or a 429."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from services.gateway.errors import RateLimited
from services.gateway.shaping.limits import KeyLimit, Limit, LimitTable, scope_of

# Float noise must not turn an exact 2 s into a Retry-After of 3 s.
_EPSILON = 1e-9


def _ceil(seconds: float) -> int:
    return max(0, math.ceil(seconds - _EPSILON))


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    """The bucket's size (its burst)."""
    remaining: int
    """Whole tokens left after this request."""
    reset_s: float
    """Seconds until the bucket is full again."""
    retry_after_s: float
    """Seconds until the next token (0 when allowed)."""
    rps: float
    scope: str
    """Whose bucket, for messages: ``tenant 'acme'`` or ``tenant 'acme' on model 'classifier'``."""

    @property
    def retry_after(self) -> int:
        """``Retry-After`` in whole seconds: rounded up (a retry sooner would be refused again), at least 1."""
        return max(1, _ceil(self.retry_after_s))

    def headers(self) -> dict[str, str]:
        """Response headers / gRPC metadata (lower-case names), with ``retry-after`` on a refusal."""
        headers = self._rate_headers()
        if not self.allowed:
            headers["retry-after"] = str(self.retry_after)
        return headers

    def raise_if_refused(self) -> None:
        """Raises ``RateLimited`` (429, ``Retry-After``, ``X-RateLimit-*``) when this decision refuses the request."""
        if not self.allowed:
            raise self.refusal()

    def refusal(self) -> RateLimited:
        message = (
            f"rate limit of {self.rps:g} requests/s (burst {self.limit}) exceeded for {self.scope}; "
            f"retry in {self.retry_after} s"
        )
        # Retry-After travels as retry_after_s: the REST and gRPC error handlers write it from there.
        error = RateLimited(message, headers=self._rate_headers())
        error.retry_after_s = self.retry_after
        return error

    def _rate_headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit": str(self.limit),
            "x-ratelimit-remaining": str(self.remaining),
            "x-ratelimit-reset": str(_ceil(self.reset_s)),
        }


def decide(bucket: str, limit: Limit, tokens: float, allowed: bool) -> Decision:
    """The decision for a bucket left with ``tokens`` after this request (one taken if it was allowed)."""
    return Decision(
        allowed=allowed,
        limit=limit.burst,
        remaining=int(tokens),
        reset_s=(limit.burst - tokens) / limit.rps,
        retry_after_s=0.0 if allowed else (1 - tokens) / limit.rps,
        rps=limit.rps,
        scope=scope_of(bucket),
    )


class RateLimiter(Protocol):
    async def check(self, tenant: str, model: str, own: KeyLimit | None = None) -> Decision | None:
        """Takes a token for this request; None when no limit applies to it. ``own``: the API key's own limit."""
        ...

    async def close(self) -> None: ...


class LocalRateLimiter:
    """Buckets of this process, keyed by the table's bounded bucket keys: O(1) per call, no background task."""

    def __init__(self, table: LimitTable, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._table = table
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        """Bucket key -> (tokens, when they were counted)."""

    async def check(self, tenant: str, model: str, own: KeyLimit | None = None) -> Decision | None:
        found = self._table.lookup(tenant, model, own)
        return None if found is None else self.take(*found)

    def take(self, bucket: str, limit: Limit) -> Decision:
        now = self._clock()
        tokens, then = self._buckets.get(bucket, (float(limit.burst), now))  # a new bucket starts full
        tokens = min(float(limit.burst), tokens + max(0.0, now - then) * limit.rps)
        allowed = tokens >= 1
        if allowed:
            tokens -= 1
        self._buckets[bucket] = (tokens, now)
        return decide(bucket, limit, tokens, allowed)

    async def close(self) -> None:
        self._buckets.clear()
