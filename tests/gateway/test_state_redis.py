"""The Redis state store's audit log through a real redis-server: events recorded while Redis is down or refuses
writes wait in the recording gateway's memory (its own reads show them, marked pending), are written in order with
the time they happened once Redis takes writes again, every replica then reads them, the oldest go past the bound
(counted), and a write whose answer was lost is not written twice."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from services.gateway.state import Event, RedisStateStore, RoutingRecord, StateError
from tests.redis_server import RedisServer, redis_server
from tests.waiting import eventually_async

PREFIX = "audit-test"
pytestmark = pytest.mark.slow  # starts a real redis-server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path / "redis") as running:
        yield running


@contextlib.asynccontextmanager
async def opened(url: str, **options: object) -> AsyncIterator[RedisStateStore]:
    store = RedisStateStore(url, prefix=PREFIX, **options)  # type: ignore[arg-type]
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def scan(model: str, n: int) -> Event:
    return Event("scan", model, "ok", detail={"n": n}, actor="gateway")


def numbered(events: list[Event]) -> list[tuple[str, int, str, bool]]:
    return [(e.model, e.detail["n"], e.time, e.pending) for e in events]


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def test_redis_store_writes_events_recorded_while_redis_was_down_in_order_with_their_times_once_it_is_back(
    server: RedisServer,
) -> None:
    async def ignore(model: str, record: RoutingRecord) -> None:
        pass

    async with opened(server.url) as a, opened(server.url) as b:
        before = scan("mlp", 0)
        await a.append_event(before)
        watching = asyncio.create_task(a.watch(ignore))  # its poll is what notices Redis is back
        try:
            down_at = now()
            server.kill()
            during = [scan("mlp", 1), scan("classifier", 2), scan("mlp", 3)]
            for event in during:
                await a.append_event(event)  # kept, not raised: the action it records went on
            with pytest.raises(StateError, match="3 audit events recorded here since are kept"):
                await a.events()
            back_at = now()
            server.start()

            async def shared() -> list[tuple[str, int, str, bool]]:
                with contextlib.suppress(StateError):  # b reconnects by itself at its next read
                    return numbered(await b.events())
                return []

            want = numbered([before, *during])
            assert await eventually_async(shared, want) == want  # a's poll wrote them; b reads them, in order
            assert numbered(await b.events("mlp")) == [want[0], want[1], want[3]]
            assert all(down_at <= dt.datetime.fromisoformat(e.time) <= back_at for e in during)
            assert numbered(await a.events()) == want  # written once: no pending copy, no second entry
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def test_redis_store_shows_events_redis_refused_as_pending_to_its_own_reads_and_writes_them_once_it_can(
    server: RedisServer,
) -> None:
    inspector = aioredis.from_url(server.url, decode_responses=True)
    try:
        async with opened(server.url) as a, opened(server.url) as b:
            await a.append_event(scan("mlp", 0))
            await inspector.config_set("min-replicas-to-write", 1)  # Redis answers reads and refuses writes
            refused = scan("mlp", 1)
            await a.append_event(refused)

            mine = await a.events("mlp")
            assert [(e.detail["n"], e.pending) for e in mine] == [(0, False), (1, True)]
            assert mine[1].to_json()["pending"] is True
            assert "pending" not in mine[0].to_json()  # the JSON clients already read is unchanged
            assert [e.detail["n"] for e in await b.events("mlp")] == [0]  # not shared yet
            with pytest.raises(StateError, match="refused it: .*NOREPLICAS"):  # not "unreachable": it answered
                await a.save_routing("mlp", RoutingRecord(stable=1))

            await inspector.config_set("min-replicas-to-write", 0)
            written = await b_reads_after_a_reads(a, b)
            assert [(e.detail["n"], e.time, e.pending) for e in written] == [(0, mine[0].time, False),
                                                                          (1, refused.time, False)]
            assert await inspector.xlen(f"{PREFIX}:events:mlp") == 2
    finally:
        await inspector.aclose()


async def b_reads_after_a_reads(a: RedisStateStore, b: RedisStateStore) -> list[Event]:
    """A read on ``a`` tries its pending events first; then ``b`` reads what Redis holds."""
    await a.events("mlp")
    return await b.events("mlp")


async def test_redis_store_drops_the_oldest_pending_events_past_its_bound_and_counts_them(
    server: RedisServer,
) -> None:
    registry = CollectorRegistry()
    async with opened(server.url, events_pending=2, registry=registry) as a:
        assert registry.get_sample_value("switchyard_audit_events_pending") == 0
        assert registry.get_sample_value("switchyard_audit_events_dropped_total") == 0
        server.kill()
        for n in (1, 2, 3):
            await a.append_event(scan("mlp", n))
        assert registry.get_sample_value("switchyard_audit_events_pending") == 2
        assert registry.get_sample_value("switchyard_audit_events_dropped_total") == 1
        server.start()
        assert [e.detail["n"] for e in await a.events("mlp")] == [2, 3]
        assert registry.get_sample_value("switchyard_audit_events_pending") == 0


class LosingProxy:
    """A TCP relay to the real redis-server that can lose Redis's next answer (the command ran; only its reply
    never arrives) and then refuse connections, as a network that breaks right after Redis took a write."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.lose_next = False
        self.refusing = False
        self.lost = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def __aenter__(self) -> LosingProxy:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.refusing:
                return
            redis_in, redis_out = await asyncio.open_connection("127.0.0.1", self.upstream)
            try:
                await asyncio.gather(self._pipe(client_in, redis_out, answers=False),
                                     self._pipe(redis_in, client_out, answers=True))
            finally:
                redis_out.close()
                with contextlib.suppress(OSError):
                    await redis_out.wait_closed()
        finally:
            client_out.close()
            with contextlib.suppress(OSError):
                await client_out.wait_closed()
            self._tasks.discard(task)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, answers: bool) -> None:
        try:
            while data := await source.read(65536):
                if answers and self.lose_next:
                    self.lose_next, self.refusing = False, True
                    self.lost += 1
                    break
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()  # one side ended: end the other, as a broken connection does


async def test_redis_store_writes_an_event_once_when_redis_took_it_but_the_answer_was_lost(
    server: RedisServer,
) -> None:
    """The connection breaks after Redis ran the write, and the network stays down a while: the store cannot tell
    the write from one Redis never saw, keeps the event and tries it again later; Redis keeps one entry."""
    inspector = aioredis.from_url(server.url, decode_responses=True)
    registry = CollectorRegistry()
    try:
        async with LosingProxy(server.port) as proxy, opened(proxy.url, registry=registry) as a:
            await a.append_event(scan("mlp", 0))
            proxy.lose_next = True  # Redis runs the next write; its answer never reaches the store
            await a.append_event(scan("mlp", 1))
            assert proxy.lost == 1
            assert registry.get_sample_value("switchyard_audit_events_pending") == 1
            assert await inspector.xlen(f"{PREFIX}:events:mlp") == 2  # Redis has it all the same

            proxy.refusing = False  # the network is back: the store tries the event again
            assert [(e.detail["n"], e.pending) for e in await a.events("mlp")] == [(0, False), (1, False)]
            assert await inspector.xlen(f"{PREFIX}:events:mlp") == 2
            assert registry.get_sample_value("switchyard_audit_events_pending") == 0
    finally:
        await inspector.aclose()
