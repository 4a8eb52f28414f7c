"""``RedisRateLimiter``: token buckets shared by every gateway replica, each taken from in one atomic Lua script
that runs on the Redis server's clock, so replicas whose clocks disagree still agree on the refill."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from services.gateway.shaping.limits import KeyLimit, LimitTable
from services.gateway.shaping.ratelimit import Decision, LocalRateLimiter, decide

log = logging.getLogger(__name__)

# KEYS[1]: the bucket hash; ARGV: rps, burst, TTL in ms. Returns {allowed (0/1), tokens left (a string: Lua numbers
# come back truncated to integers)}. TIME before a write is allowed because Redis >= 5 replicates a script's
# effects, not the script. The time is stored as TIME's two integers: one float of epoch microseconds would lose
# digits when Lua turns it into a string.
_TAKE = """
local now = redis.call('TIME')
local rps, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 's', 'us')
local tokens, s, us = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
if tokens == nil or s == nil or us == nil then
  tokens = burst
else
  local elapsed = (tonumber(now[1]) - s) + (tonumber(now[2]) - us) / 1e6
  if elapsed > 0 then tokens = math.min(burst, tokens + elapsed * rps) end
end
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
local left = string.format('%.17g', tokens)
redis.call('HSET', KEYS[1], 'tokens', left, 's', now[1], 'us', now[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {allowed, left}
"""


class RedisRateLimiter:
    """Fails open: while Redis is unreachable (or answers errors) each replica limits with its own local buckets
    (so N replicas allow up to N times the limit) rather than refusing traffic the models could serve; one warning
    per outage. After a failure Redis is tried again ``retry_s`` later, so an outage does not cost every request a
    timeout."""

    def __init__(
        self,
        url: str,
        prefix: str,
        table: LimitTable,
        *,
        timeout_s: float = 0.25,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table = table
        self._prefix = prefix
        self._retry_s = retry_s
        self._clock = clock
        # One immediate retry covers a pooled connection that died with a restarted server; redis-py's default
        # (10 retries with backoff) would hold every request for seconds during an outage.
        self._client: aioredis.Redis = aioredis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 1)
        )
        self._take = self._client.register_script(_TAKE)
        self._fallback = LocalRateLimiter(table, clock=clock)
        self._down_until: float | None = None
        """While Redis is out: when to try it again. None while it answers."""

    async def check(self, tenant: str, model: str, own: KeyLimit | None = None) -> Decision | None:
        found = self._table.lookup(tenant, model, own)
        if found is None:
            return None
        bucket, limit = found
        now = self._clock()
        if self._down_until is not None and now < self._down_until:
            return self._fallback.take(bucket, limit)
        # Idle buckets expire once they would be full again: a missing bucket is a full one.
        ttl_ms = math.ceil(limit.burst / limit.rps * 1000) + 1000
        try:
            allowed, tokens = await self._take(
                keys=[f"{self._prefix}:ratelimit:{bucket}"], args=[repr(limit.rps), limit.burst, ttl_ms]
            )
        except (RedisError, OSError) as exc:
            if self._down_until is None:
                log.warning("rate limits: Redis is unreachable (%s); each gateway limits on its own until it is back",
                            exc)
            self._down_until = now + self._retry_s
            return self._fallback.take(bucket, limit)
        if self._down_until is not None:
            log.info("rate limits: Redis answers again; buckets are shared again")
            self._down_until = None
        return decide(bucket, limit, float(tokens), bool(allowed))

    async def close(self) -> None:
        await self._client.aclose()
