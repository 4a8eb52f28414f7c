"""``NodeRateLimiter``: token buckets shared by the worker processes of one node, kept in the node's share
(node_share.py) and taken from under its file lock, so N workers allow what one gateway allows, not N times it."""

from __future__ import annotations

import time
from collections.abc import Callable

from services.gateway.shaping.limits import KeyLimit, Limit, LimitTable
from services.gateway.shaping.node_share import NodeShare
from services.gateway.shaping.ratelimit import Decision, decide


class NodeRateLimiter:
    """The semantics of ``LocalRateLimiter`` (a new bucket starts full, refills at ``rps`` up to ``burst``) with the
    bucket in the shared file. ``clock`` is ``time.monotonic`` (CLOCK_MONOTONIC: one clock for every process of
    the node); it is read under the lock, so the times stored in a bucket never run backwards.

    It does not close the share: whoever made the share (the worker's wiring) closes it, after every user."""

    def __init__(self, table: LimitTable, share: NodeShare, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._table = table
        self._share = share
        self._clock = clock

    async def check(self, tenant: str, model: str, own: KeyLimit | None = None) -> Decision | None:
        found = self._table.lookup(tenant, model, own)
        return None if found is None else self.take(*found)

    def take(self, bucket: str, limit: Limit) -> Decision:
        share = self._share
        index = share.slot(f"rate:{bucket}")
        with share.lock:
            now = self._clock()
            tokens, then = share.bucket(index) or (float(limit.burst), now)
            tokens = min(float(limit.burst), tokens + max(0.0, now - then) * limit.rps)
            allowed = tokens >= 1
            if allowed:
                tokens -= 1
            share.store_bucket(index, tokens, now)
        return decide(bucket, limit, tokens, allowed)

    async def close(self) -> None:
        """Nothing of its own to release (see the class docstring)."""
