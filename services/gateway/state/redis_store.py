"""``RedisStateStore``: routing records, the audit log and the per-model action lock in Redis, shared by every
gateway replica. Changes reach the others by pub/sub within milliseconds, and by a one-second poll when a
message is lost (a replica that was cut off from Redis resynchronises the same way). Audit events Redis cannot take
wait in memory (``event_backlog``) and are written, in order, once it can."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.gateway.shaping.json_limits import bounded_json
from services.gateway.state.event_backlog import EVENTS_PENDING, EventBacklog, Pending
from services.gateway.state.records import Event, RoutingRecord, StateError
from services.gateway.state.store import OnChange, StateBusy

log = logging.getLogger(__name__)
POLL_S = 1.0
EVENTS_KEPT = 10_000
# Renew or release the lock only while it is still ours (the value holds a random token).
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
WRITTEN_MARK_S = 7 * 24 * 3600
"""How long Redis remembers that an event's id was written: a write tried again within it (its answer was lost, by
redis-py's own retry or the backlog's) is not written twice."""
# Append an event once per id (KEYS[2] marks the id written), atomically: the mark is set only with the entry, so
# an event whose write failed is never taken for written. Each entry takes the next number of one counter (KEYS[3])
# for every model's stream: the order events of one millisecond were written in, across streams (two streams' own
# entry ids can be equal). Returns the entry's id, or nil when it was there already.
_APPEND = """
if redis.call('exists', KEYS[2]) == 1 then return false end
local seq = redis.call('incr', KEYS[3])
local entry = redis.call('xadd', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[1], 'id', ARGV[2], 'seq', seq)
redis.call('set', KEYS[2], '1', 'PX', ARGV[4])
return entry
"""


class RedisStateStore:
    shared = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "switchyard",
        lock_ttl_s: float = 15.0,
        events_pending: int = EVENTS_PENDING,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``events_pending``: the most audit events kept in memory while Redis cannot take them; ``registry``:
        where their figures are counted (``switchyard_audit_events_pending``, ``_dropped_total``)."""
        self._url = url
        self._prefix = prefix
        self._lock_ttl_ms = int(lock_ttl_s * 1000)
        self._client: Any = None
        self._append: Any = None
        self._down = False
        self._backlog = EventBacklog(events_pending, registry)
        self._writing = asyncio.Lock()
        """Held while the backlog is written: one writer at a time keeps the events in the order recorded."""
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
        self._append = self._client.register_script(_APPEND)
        await self._call("connecting", self._client.ping())

    async def close(self) -> None:
        if self._client is not None:
            if not self._down:
                await self._write_pending_quietly()
            if self._backlog:
                log.error("%d audit events recorded while %s could not take them are lost with this gateway (each "
                          "was logged as it was kept)", len(self._backlog), self._where)
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
        """Written after the events still pending, never before; kept pending (and logged) when Redis cannot take
        it, instead of raising: the backlog writes it once Redis can."""
        pending = Pending(event)
        self._backlog.keep(pending)
        try:
            await self._write_pending()
        except StateError as exc:
            if pending in self._backlog:
                log.warning("audit event kept in this gateway's memory until the state store takes it (%d pending, "
                            "at most %d kept): %s: %s", len(self._backlog), self._backlog.bound, exc,
                            json.dumps(event.to_json()))

    async def events(self, model: str | None = None, limit: int = 100) -> list[Event]:
        """What Redis holds and, marked ``pending``, what this gateway recorded that it has not taken yet."""
        if not self._down:  # else the poll writes them as soon as Redis answers; a read need not wait for a try
            await self._write_pending_quietly()
        try:
            written = await self._read_events(model, limit)
        except StateError as exc:
            pending = sum(1 for p in self._backlog if model is None or p.event.model == model)
            if pending:
                raise StateError(f"{exc}; {pending} audit events recorded here since are kept in this gateway's "
                                 "memory and written there once it answers") from None
            raise
        shown = {entry.id for entry in written}
        found = [(entry.order, entry.event) for entry in written]
        found.extend(
            (_UNWRITTEN, replace(p.event, pending=True))
            for p in self._backlog
            if (model is None or p.event.model == model) and p.id not in shown  # written, its answer not yet seen
        )
        # By the time each happened; events of one millisecond in the order Redis took them (pending ones last, in
        # the order recorded: the sort is stable).
        found.sort(key=lambda item: (item[1].time, item[0]))
        return [event for _, event in found[-limit:]]

    async def _read_events(self, model: str | None, limit: int) -> list[_Entry]:
        """The newest ``limit`` entries of each model's stream."""
        keys = [f"{self._prefix}:events:{model}"] if model is not None else await self._call(
            "reading the audit log", self._event_keys()
        )
        found: list[_Entry] = []
        for key in keys:
            entries = await self._call("reading the audit log", self._client.xrevrange(key, count=limit))
            found.extend(_Entry.read(entry, fields) for entry, fields in entries)
        return found

    async def _event_keys(self) -> list[str]:
        return [key async for key in self._client.scan_iter(match=f"{self._prefix}:events:*")]

    async def _write_pending(self) -> None:
        """Write the pending events, oldest first; ``StateError`` at the first Redis does not take (it and the
        later ones stay pending). Each is written at most once, however often it is tried (``_APPEND``)."""
        written = []
        async with self._writing:
            try:
                while (pending := self._backlog.oldest()) is not None:
                    key = f"{self._prefix}:events:{pending.event.model}"
                    args = [json.dumps(pending.event.to_json()), pending.id, EVENTS_KEPT, WRITTEN_MARK_S * 1000]
                    marked = f"{self._prefix}:event-written:{pending.id}"
                    keys = [key, marked, f"{self._prefix}:event-seq"]
                    await self._call("writing the audit log", self._append(keys=keys, args=args))
                    self._backlog.written(pending)
                    written.append(pending)
            except StateError:
                self._backlog.refused()
                raise
            finally:
                late = [p.event for p in written if p.refused]
                if late:
                    log.info("wrote %d audit events that waited for %s, recorded from %s to %s", len(late),
                             self._where, late[0].time, late[-1].time)

    async def _write_pending_quietly(self) -> None:
        """Try the pending events now; those Redis does not take wait for the next try (each was logged when kept)."""
        if self._backlog:
            with contextlib.suppress(StateError):
                await self._write_pending()

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
            await self._write_pending_quietly()
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
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StateError(f"{action} failed: the state store ({self._where}) is unreachable: {exc}") from None
        except RedisError as exc:  # it answered no: out of memory, a full disk, a read-only replica
            raise StateError(f"{action} failed: the state store ({self._where}) refused it: {exc}") from None


_UNWRITTEN = (2**64, 0, 0)
"""Where a pending event goes among events of its millisecond: after every entry Redis holds."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """One audit event as its stream holds it."""

    order: tuple[int, int, int]
    """The order Redis took it in: the shared counter's number (0 on entries written before it), then the entry's
    stream id (Redis's milliseconds, sequence)."""
    id: str | None
    """The id it was written under (``_APPEND``); none on entries from before ids."""
    event: Event

    @classmethod
    def read(cls, entry: str, fields: Mapping[str, str]) -> _Entry:
        ms, _, sequence = entry.partition("-")
        order = (int(fields.get("seq", 0)), int(ms), int(sequence or 0))
        return cls(order, fields.get("id"), Event.from_json(json.loads(fields["event"])))


def _redacted(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, _, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    return f"{scheme}://{host}" if at else url
