"""A request whose routed version the model cache has not loaded: it waits for the load (``ModelCache.fault_in``,
within its deadline) and is routed again. A version unloaded again before the request got to it (the cache needed
the room) is loaded again, a few times at most."""

from __future__ import annotations

from services.gateway.capacity.cache import ModelCache
from services.gateway.tensors.types import InferRequest
from services.gateway.versions.routing import ColdVersion, Header, Router

ATTEMPTS = 3


async def route_cold(
    cache: ModelCache | None, router: Router, cold: ColdVersion, request: InferRequest, header: Header | None
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
