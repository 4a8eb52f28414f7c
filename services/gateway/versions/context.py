"""What the swap protocol's helpers (``follow``, ``replicas``, ``startup``, ``loading``, ``traffic``, ``reports``) use
of the version manager. They take this protocol instead of importing ``manager``, so that the manager, which calls
them, is the only module that knows them all: the imports run one way (docs/architecture.md, "Versions")."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from services.gateway.backends.base import Backend
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings
from services.gateway.state import Event, RoutingRecord, StateStore
from services.gateway.state.policies import CanaryPolicy
from services.gateway.versions.leases import Leases
from services.gateway.versions.progress import ActionReport, Steps
from services.gateway.versions.routing import Router
from services.gateway.versions.warmup import WarmedUp
from services.gateway.versions.windows import TrafficWindows


class OnDemand(Protocol):
    """The model cache as the versions see it (``capacity/cache.py``; the versions never import it)."""

    pinned: frozenset[str]

    def attach(self, manager: Any) -> None:
        """Start: the version manager whose locks, leases, router and warm-up it uses."""

    async def close(self) -> None: ...

    def view(self, model: str) -> dict[str, Any]:
        """The model as the admin API shows it: resident, memory, how it was come by, idle seconds, pinned."""

    def summary(self) -> dict[str, Any]:
        """Budget, memory in use, pinned models."""

    def reason(self, model: str) -> str:
        """Why the routed version is not loaded, for the repository index."""


class VersionContext(Protocol):
    settings: Settings
    catalog: Catalog
    backend: Backend
    router: Router
    leases: Leases
    store: StateStore
    metrics: GatewayMetrics
    windows: TrafficWindows
    last: dict[str, ActionReport]
    """The last report of each model's actions."""
    follow_failures: dict[tuple[str, int], float]
    """(model, generation) -> when following a routing record another gateway wrote failed."""
    behind: dict[str, tuple[int, str]]
    """model -> the newest generation another gateway wrote that this one could not take, and why."""
    cache: OnDemand | None
    """The model cache, when ``SWITCHYARD_MODEL_CACHE_MB`` is set: only pinned models load at start or follow the
    routing's loaded versions; the others load on demand."""

    async def activate(
        self,
        model: str,
        version: int,
        *,
        keep_previous: bool = ...,
        drain_timeout_s: float | None = ...,
        compare: bool = ...,
        actor: str = ...,
    ) -> ActionReport: ...

    async def promote(self, model: str, canary: CanaryPolicy) -> ActionReport | None:
        """The canary watch's promotion: activate the canary's version while that split holds and it is ready."""
        ...

    def exclusive(
        self, model: str, action: str, version: int | None, actor: str = ...
    ) -> AbstractAsyncContextManager[Steps]:
        """One action per model at a time (409 for a second one); the steps the action reports. ``actor``: who asked
        (the audit log's, when the store refuses the action its lock)."""
        ...

    def lock(self, model: str) -> asyncio.Lock: ...

    async def prepare(self, model: str, version: int, steps: Steps) -> WarmedUp | None: ...

    async def warm(self, model: str, version: int, steps: Steps) -> WarmedUp: ...

    def loaded_now(
        self, model: str, *, plus: set[int] | None = None, minus: set[int] | None = None
    ) -> tuple[int, ...]: ...

    async def commit_routing(
        self, model: str, record: RoutingRecord, *, fresh: Collection[int] = ...
    ) -> RoutingRecord:
        """Persist and route by ``record``, naming the export of each version it routes to (``fresh``: the versions
        the action has just loaded from disk); the record as committed."""
        ...

    def set_routing(self, model: str, record: RoutingRecord) -> None: ...

    async def record(self, event: Event) -> None: ...

    def drain_timeout(self, requested: float | None) -> float: ...

    async def quietly(self, call: Coroutine[Any, Any, None], what: str) -> None: ...
