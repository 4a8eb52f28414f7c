"""Rate limits shared through a real redis-server: two limiters (two replicas) draw from one bucket, idle buckets
expire, the bucket runs on the server's clock, and with Redis gone each replica limits on its own (one warning)
until it is back."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.gateway.shaping.limits import LimitTable
from services.gateway.shaping.redis_buckets import RedisRateLimiter
from tests.redis_server import RedisServer, redis_server

PREFIX = "ratelimit-test"
LOGGER = "services.gateway.shaping.redis_buckets"
pytestmark = pytest.mark.slow  # starts a real redis-server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as running:
        yield running


@pytest.fixture
async def inspector(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(server.url, decode_responses=True)
    yield client
    await client.aclose()


async def allowed(limiter: RedisRateLimiter, tenant: str = "acme") -> tuple[bool, int]:
    decision = await limiter.check(tenant, "mlp")
    assert decision is not None
    return decision.allowed, decision.remaining


async def test_redis_rate_limiter_shares_one_bucket_when_two_replicas_use_it(server: RedisServer) -> None:
    table = LimitTable(0.01, 4)
    a, b = RedisRateLimiter(server.url, PREFIX, table), RedisRateLimiter(server.url, PREFIX, table)
    try:
        answers = [await allowed(replica) for replica in (a, b, a, b)]
        assert answers == [(True, 3), (True, 2), (True, 1), (True, 0)]
        assert await allowed(a) == (False, 0)
        refused = await b.check("acme", "mlp")
        assert refused is not None
        assert not refused.allowed
        assert refused.retry_after in (99, 100)  # one token per 100 s, a few ms of which have passed
        assert await allowed(a, "beta") == (True, 3)  # another tenant, another bucket
    finally:
        await a.close()
        await b.close()


async def test_redis_rate_limiter_expires_buckets_on_the_server_clock_when_idle(
    server: RedisServer, inspector: aioredis.Redis
) -> None:
    limiter = RedisRateLimiter(server.url, PREFIX, LimitTable(2, 4))
    try:
        await limiter.check("acme", "mlp")
    finally:
        await limiter.close()
    key = f"{PREFIX}:ratelimit:tenant:acme"
    assert 0 < await inspector.pttl(key) <= 3000  # full again after 4 / 2 = 2 s, plus a second's margin
    state = await inspector.hgetall(key)
    assert float(state["tokens"]) == 3
    seconds, _ = await inspector.time()
    assert abs(int(state["s"]) - seconds) <= 1


async def test_redis_rate_limiter_starts_a_full_bucket_when_the_stored_one_is_incomplete(
    server: RedisServer, inspector: aioredis.Redis
) -> None:
    await inspector.hset(f"{PREFIX}:ratelimit:tenant:acme", mapping={"tokens": "0"})  # no timestamp
    limiter = RedisRateLimiter(server.url, PREFIX, LimitTable(1, 2))
    try:
        assert await allowed(limiter) == (True, 1)
    finally:
        await limiter.close()


async def test_redis_rate_limiter_fails_open_and_recovers_when_redis_goes_away_and_returns(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    table = LimitTable(0.01, 3)
    a = RedisRateLimiter(server.url, PREFIX, table, retry_s=0.0)  # tries Redis on every call
    b = RedisRateLimiter(server.url, PREFIX, table, retry_s=0.0)
    try:
        assert await allowed(a) == (True, 2)
        server.kill()
        # Local buckets meanwhile: open, but still limited to one replica's burst.
        assert [await allowed(a) for _ in range(4)] == [(True, 2), (True, 1), (True, 0), (False, 0)]
        assert await allowed(b) == (True, 2)
        warnings = [text for name, level, text in caplog.record_tuples if name == LOGGER and level == logging.WARNING]
        assert len(warnings) == 2  # one per replica and outage, none per request
        assert "unreachable" in warnings[0]

        server.start()
        first = await allowed(a)
        assert first[0]
        assert await allowed(b) == (True, first[1] - 1)  # one shared bucket again
        assert "answers again" in caplog.text
    finally:
        await a.close()
        await b.close()

