"""``CachedBackend``: the node's backend with every load and unload accounted by the model cache. A load first makes
room within the budget (unloading least recently used models), then is measured (embedded: the process's resident
memory before and after) or takes the declared or estimated cost; a version that alone exceeds the budget is
refused with both figures. Everything else is the wrapped backend's own method, bound once: the request path
(``state``, ``infer``) pays no extra call."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from services.gateway.backends.base import Backend
from services.gateway.capacity.cache import ROOM_WAIT_S, ModelCache, room_wait_s
from services.gateway.capacity.memory import Cost, MemoryDeclarationError
from services.gateway.capacity.metrics import CacheMetrics
from services.gateway.errors import InvalidInput
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings

_PASSED = ("live", "models", "state", "problem", "ready", "metadata", "config", "infer", "decoupled", "infer_stream",
           "statistics", "close")


class CachedBackend:
    def __init__(self, inner: Backend, cache: ModelCache) -> None:
        self.inner = inner
        self.cache = cache
        self.shared_server = inner.shared_server
        self.enforces_deadlines = inner.enforces_deadlines
        self.forwards_parameters = inner.forwards_parameters
        for name in _PASSED:
            setattr(self, name, getattr(inner, name))

    def __getattr__(self, name: str) -> Any:
        """What the Backend protocol does not name (the Triton backend's shared-memory mirror, the embedded
        backend's tracing switch): the wrapped backend's."""
        return getattr(self.inner, name)

    async def start(self, initial: Mapping[str, Collection[int]]) -> None:
        """Starts the backend empty, then loads ``initial`` (the pinned models) one by one, each within the budget
        and measured; a version that fails is reported by the backend's ``problem``, as ``start`` does."""
        await self.inner.start({})
        for model, versions in initial.items():
            for version in sorted(versions):
                try:
                    await self.load(model, version)
                except Exception as exc:  # noqa: BLE001 - start never raises for one model: it is reported
                    self.cache.startup_failed(model, version, exc)

    async def load(self, model: str, version: int) -> None:
        cache = self.cache
        try:
            expected, floor = cache.expected(model, version), cache.floor(model, version)
        except MemoryDeclarationError as exc:
            raise InvalidInput(str(exc)) from None
        cache.refuse_if_too_large(model, version, expected)
        async with cache.room:  # one load at a time: each measured alone, the budget never promised twice
            await cache.make_room(model, expected.mb, room_wait_s.get(ROOM_WAIT_S))
            before = cache.measure() if cache.in_process else 0.0
            await self.inner.load(model, version)
            cost = floor
            if cache.in_process:  # what the process grew by, unless the declaration or the files say more
                grown = cache.measure() - before
                cost = Cost(grown, "measured") if grown > floor.mb else floor
            if cost.mb > cache.budget_mb:
                await self.inner.unload(model, version)
                cache.refuse_if_too_large(model, version, cost)
            cache.loaded(model, version, cost)
            await cache.fit_after(model)

    async def unload(self, model: str, version: int) -> None:
        try:
            await self.inner.unload(model, version)
        finally:
            if self.inner.state(model, version) is None:
                self.cache.unloaded(model, version)

    async def adopt(self, model: str, versions: Collection[int]) -> None:
        """Another gateway's versions on the shared server: that gateway's cache accounted their loads."""
        await self.inner.adopt(model, versions)


def with_model_cache(
    settings: Settings, catalog: Catalog, metrics: GatewayMetrics, backend: Backend
) -> tuple[Backend, ModelCache | None]:
    """``backend`` wrapped by the model cache when ``SWITCHYARD_MODEL_CACHE_MB`` is set, and the cache."""
    if settings.model_cache_mb is None:
        return backend, None
    cache = ModelCache(settings, catalog, metrics, CacheMetrics(metrics.registry), in_process=not backend.shared_server)
    return CachedBackend(backend, cache), cache
