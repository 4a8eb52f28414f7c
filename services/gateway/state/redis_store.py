"""``RedisStateStore``: routing records, the audit log and the per-model action lock in Redis, shared by every
gateway replica. Changes reach the others by pub/sub within milliseconds, and by a one-second poll when a
message is lost (a replica that was cut off from Redis resynchronises the same way)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from services.gateway.shaping.json_limits import bounded_json
from services.gateway.state.records import Event, RoutingRecord, StateError
from services.gateway.state.store import OnChange, StateBusy

log = logging.getLogger(__name__)
POLL_S = 1.0
EVENTS_KEPT = 10_000
# Renew or release the lock only while it is still ours (the value holds a random token).
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class RedisStateStore:
    shared = True

    def __init__(self, url: str, *, prefix: str = "switchyard", lock_ttl_s: float = 15.0) -> None:
        self._url = url
        self._prefix = prefix
        self._lock_ttl_ms = int(lock_ttl_s * 1000)
        self._client: Any = None
        self._down = False
        self._unreleased: dict[str, str] = {}
        """Lock key -> our value, for the locks whose release failed (Redis unreachable as the action ended): a Redis
        that comes back from its append-only file still holds them, and would refuse every replica's action on the
        model (409 naming an action that has ended) until the lock's time to live ran out."""

    @property
    def _routing(self) -> str:
        return f"{self._prefix}:routing"

    @property
    def _channel(self) -> str:
        return f"{self._prefix}:routing:changed"

    async def open(self) -> None:
        self._client = aioredis.from_url(
            self._url, socket_timeout=2.0, socket_connect_timeout=2.0, decode_responses=True
        )
        await self._call("connecting", self._client.ping())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def load_routing(self) -> Mapping[str, RoutingRecord]:
        raw = await self._call("reading the routing", self._client.hgetall(self._routing))
        records = {}
        for model, text in raw.items():
            try:
                records[model] = RoutingRecord.from_json(bounded_json(text))
            except ValueError as exc:
                raise StateError(
                    f"the routing record of model '{model}' in {self._where} is not valid: {exc}; the gateway will "
                    f"not guess the routing: fix or delete the field (HDEL {self._routing} {model})"
                ) from None
        return records

    async def save_routing(self, model: str, record: RoutingRecord) -> None:
        """One transaction writes the record and announces it, so a replica that hears of it can read it."""
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(self._routing, model, json.dumps(record.to_json()))
        pipe.publish(self._channel, model)
        await self._call("saving the routing", pipe.execute())

    async def append_event(self, event: Event) -> None:
        key = f"{self._prefix}:events:{event.model}"
        entry = {"event": json.dumps(event.to_json())}
        await self._call("writing the audit log", self._client.xadd(key, entry, maxlen=EVENTS_KEPT, approximate=True))

    async def events(self, model: str | None = None, limit: int = 100) -> list[Event]:
        if model is None:
            keys = [key async for key in self._client.scan_iter(match=f"{self._prefix}:events:*")]
        else:
            keys = [f"{self._prefix}:events:{model}"]
        found: list[Event] = []
        for key in keys:
            entries = await self._call("reading the audit log", self._client.xrevrange(key, count=limit))
            found.extend(Event.from_json(json.loads(fields["event"])) for _, fields in entries)
        return sorted(found, key=lambda event: event.time)[-limit:]

    @contextlib.asynccontextmanager
    async def lock(self, model: str, holder: str) -> AsyncIterator[None]:
        key = f"{self._prefix}:lock:{model}"
        value = json.dumps({"token": uuid.uuid4().hex, "holder": holder})
        await self._release_unreleased()
        taken = await self._call("locking", self._client.set(key, value, nx=True, px=self._lock_ttl_ms))
        if not taken:
            current = await self._call("locking", self._client.get(key))
            other = json.loads(current).get("holder", "another gateway") if current else "another gateway"
            raise StateBusy(f"model '{model}' is busy on another gateway: {other}")
        renewal = asyncio.create_task(self._renew(key, value))
        try:
            yield
        finally:
            renewal.cancel()
            await asyncio.gather(renewal, return_exceptions=True)
            self._unreleased[key] = value
            await self._release_unreleased()

    async def watch(self, on_change: OnChange) -> None:
        """Every poll tells every record, not only those it has not told before: a replica that could not take a
        record (a version its repository lacked for a while) takes it once it can, not at the next change."""
        await asyncio.gather(self._listen(on_change), self._poll(on_change))

    async def _listen(self, told: OnChange) -> None:
        """Pub/sub: each message names a model whose record changed."""
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    model = str(message["data"])
                    text = await self._client.hget(self._routing, model)
                    if text:
                        await told(model, RoutingRecord.from_json(bounded_json(text)))
            except (RedisError, OSError, ValueError) as exc:
                log.debug("routing subscription lost (%s); retrying", exc)
                await asyncio.sleep(POLL_S)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()

    async def _poll(self, told: OnChange) -> None:
        """The fallback: a lost message, or a replica cut off from Redis for a while, catches up here."""
        while True:
            await asyncio.sleep(POLL_S)
            try:
                records = await self.load_routing()
            except StateError as exc:
                if not self._down:
                    log.warning("%s; serving the last routing known", exc)
                self._down = True
                continue
            if self._down:
                log.info("the state store at %s answers again; following its routing", self._where)
                self._down = False
            await self._release_unreleased()
            for model, record in records.items():
                await told(model, record)

    async def _release_unreleased(self) -> None:
        """Release the locks this gateway still holds for actions that have ended (only while still ours: one that
        expired meanwhile may be another gateway's now); those Redis cannot be reached for wait for the next try."""
        for key, value in list(self._unreleased.items()):
            try:
                await self._client.eval(_RELEASE, 1, key, value)
            except (RedisError, OSError):
                return
            if self._unreleased.get(key) == value:  # not a lock of a later action, taken while this awaited
                del self._unreleased[key]

    async def _renew(self, key: str, value: str) -> None:
        while True:
            await asyncio.sleep(self._lock_ttl_ms / 3000)
            with contextlib.suppress(RedisError, OSError):
                await self._client.eval(_RENEW, 1, key, value, self._lock_ttl_ms)

    @property
    def _where(self) -> str:
        return f"Redis at {_redacted(self._url)}"

    async def _call(self, action: str, call: Any) -> Any:
        if self._client is None:
            raise RuntimeError("RedisStateStore used before open()")
        try:
            return await call
        except (RedisError, OSError) as exc:
            raise StateError(f"{action} failed: the state store ({self._where}) is unreachable: {exc}") from None


def _redacted(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    return f"{scheme}://{host}" if at else url
