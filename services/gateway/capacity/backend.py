"""``CachedBackend``: the node's backend with every load and unload accounted by the model cache. A load first makes
room within the budget (unloading least recently used models), then is measured (embedded: the process's resident
memory before and after) or takes the declared or estimated cost; a version that alone exceeds the budget is
refused with both figures. Everything else is the wrapped backend's own method, bound once: the request path
(``state``, ``infer``) pays no extra call."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from services.gateway.backends.base import Backend
from services.gateway.capacity.cache import ModelCache
from services.gateway.capacity.demand import Demand, load_demand
from services.gateway.capacity.memory import Cost, LocalServer, Measure, MemoryDeclarationError, this_process
from services.gateway.capacity.metrics import CacheMetrics
from services.gateway.errors import InvalidInput
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings

log = logging.getLogger(__name__)

_PASSED = ("live", "models", "state", "problem", "ready", "metadata", "config", "infer", "decoupled", "infer_stream",
           "statistics", "close")


class CachedBackend:
    def __init__(self, inner: Backend, cache: ModelCache) -> None:
        self.inner = inner
        self.cache = cache
        self.shared_server = inner.shared_server
        # As the data plane reads them: a backend that does not say does neither.
        self.enforces_deadlines: bool = getattr(inner, "enforces_deadlines", False)
        self.forwards_parameters: bool = getattr(inner, "forwards_parameters", False)
        self.runs_model_warmup: bool = getattr(inner, "runs_model_warmup", False)
        for name in _PASSED:
            if hasattr(inner, name):  # test doubles leave out what they do not serve
                setattr(self, name, getattr(inner, name))

    def __getattr__(self, name: str) -> Any:
        """What the Backend protocol does not name (the Triton backend's shared-memory mirror, the embedded
        backend's tracing switch): the wrapped backend's."""
        return getattr(self.inner, name)

    async def start(self, initial: Mapping[str, Collection[int]]) -> None:
        """Starts the backend empty, then loads ``initial`` (the pinned models) one by one, each within the budget
        and measured; a version that fails is reported by the backend's ``problem``, as ``start`` does. The
        repository has been read by now: a pinned model it lacks is named."""
        self.cache.check_pinned()
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
        # Its turn, with room for it: measured alone, and the room it was given counted on by no other load.
        async with cache.room_for(model, version, expected.mb, load_demand.get() or Demand.background()):
            await self._prime(model)
            before = cache.measure()
            await self.inner.load(model, version)
            after = cache.measure()
            cost = floor
            if before is not None and after is not None:  # what it grew by, unless the declaration or files say more
                grown = after - before
                cost = Cost(grown, "measured") if grown > floor.mb else floor
            if cost.mb > cache.budget_mb:
                cache.remember(model, version, cost)  # its next request is refused without loading it again
                await self.inner.unload(model, version)
                cache.refuse_if_too_large(model, version, cost)
            cache.loaded(model, version, cost)
            await cache.fit_after(model)

    async def _prime(self, model: str) -> None:
        """The runtime's own start, before the first load that needs it is measured (embedded: torch, onnxruntime;
        ``backends/priming.py``): memory no model should be charged."""
        prime = getattr(self.inner, "prime_runtime", None)
        if prime is None:
            return
        before = self.cache.measure()
        if await prime(model):
            after = self.cache.measure()
            took = "" if before is None or after is None else f", {after - before:.1f} MiB"
            log.info("model cache: started the runtime model '%s' runs on before its first load (charged to no "
                     "model%s)", model, took)

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
    # The embedded backend's models live in this process; Triton's in its own, measured when it runs on this host.
    measure: Measure = LocalServer(settings.triton_url) if backend.shared_server else this_process
    cache = ModelCache(settings, catalog, metrics, CacheMetrics(metrics.registry), measure=measure)
    return CachedBackend(backend, cache), cache
