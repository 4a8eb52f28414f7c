"""Who a model cache load is for (``Demand``: the requests waiting for it, or none), and a request whose routed
version the model cache has not loaded: it waits for the load (``ModelCache.fault_in``, within its deadline) and is
routed again. A version unloaded again before the request got to it (the cache needed the room) is loaded again, a
few times at most."""

from __future__ import annotations

import asyncio
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, Protocol

from services.gateway.tensors.types import InferRequest
from services.gateway.versions.routing import ColdVersion, Header, Router

ROOM_WAIT_S = 30.0
"""How long a load not made for a request (an activation, a canary) waits for room before it is refused; a request
without a deadline waits as long."""

Stage = Literal["queued", "room", "loading"]


@dataclass(eq=False)
class Demand:
    """Who a load is for and how far it got. It waits for room only while it is wanted: for requests
    (``fault_in``), while one of them still waits within its deadline; otherwise up to ``ROOM_WAIT_S``. Every other
    step goes on whoever still waits; the model is then kept for the requests still waiting until they are served
    or gone (deadline passed, cancelled), never longer: nothing can pin it."""

    for_requests: bool
    until: float
    """``time.monotonic()``: the latest deadline of the requests that joined (``ROOM_WAIT_S`` on for one without)."""
    waiting: int = 0
    """Requests waiting for it now."""
    stage: Stage = "queued"
    needed_mb: float | None = None
    """What it makes room for, once it does."""
    task: asyncio.Task[None] = field(init=False)

    @classmethod
    def background(cls) -> Demand:
        return cls(for_requests=False, until=time.monotonic() + ROOM_WAIT_S)

    def join(self, deadline: float | None) -> None:
        self.waiting += 1
        self.until = max(self.until, time.monotonic() + ROOM_WAIT_S if deadline is None else deadline)

    def leave(self) -> None:
        self.waiting -= 1

    def wanted(self) -> bool:
        """Whether it may still wait for room."""
        return (self.waiting > 0 or not self.for_requests) and time.monotonic() < self.until


load_demand: ContextVar[Demand | None] = ContextVar("load_demand", default=None)
"""The demand of the load under way in this task (``_bring_in``); a load outside one (an activation, a canary, the
repository API, a pinned model at start) has none and waits for room up to ``ROOM_WAIT_S``."""


ATTEMPTS = 3


class FaultsIn(Protocol):
    """What ``route_cold`` asks of the model cache (``ModelCache``, which builds on ``Demand`` here)."""

    async def fault_in(self, model: str, version: int, deadline: float | None) -> None: ...

    def touch(self, model: str, *, hit: bool = True) -> None: ...


async def route_cold(
    cache: FaultsIn | None, router: Router, cold: ColdVersion, request: InferRequest, header: Header | None
) -> int:
    """The version ``request`` is served by once its cold version is loaded; raises ``cold`` (503) without a cache."""
    if cache is None:
        raise cold
    for attempt in range(ATTEMPTS):
        await cache.fault_in(cold.model, cold.routed, request.deadline)
        try:
            version = router.route(request.model, request.version, header)
        except ColdVersion as again:
            if attempt == ATTEMPTS - 1:
                raise
            cold = again
            continue
        cache.touch(request.model, hit=False)
        return version
    raise cold
