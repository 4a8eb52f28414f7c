"""Loading and unloading versions without changing where unversioned requests go; the routing record notes what
is loaded, so that other replicas converge on it."""

from __future__ import annotations

from services.gateway.errors import Conflict, GatewayError, unknown_version
from services.gateway.tensors.types import VersionState
from services.gateway.versions.context import VersionContext
from services.gateway.versions.progress import GATEWAY, ActionReport
from services.gateway.versions.reports import failed, finish


async def load_version(manager: VersionContext, model: str, version: int, *, actor: str = GATEWAY) -> ActionReport:
    """Load and warm ``version`` up without routing to it (pinned requests reach it)."""
    async with manager.exclusive(model, "load", version) as steps:
        if manager.backend.state(model, version) is VersionState.READY:
            return await finish(manager, steps, "unchanged", {"version": version}, actor)
        try:
            await manager.prepare(model, version, steps)
            await note_loaded(manager, model)
        except GatewayError as exc:
            raise await failed(manager, steps, exc, {"version": version}, actor, None) from None
        return await finish(manager, steps, "ok", {"version": version}, actor)


async def unload_version(
    manager: VersionContext,
    model: str,
    version: int,
    *,
    drain_timeout_s: float | None = None,
    actor: str = GATEWAY,
) -> ActionReport:
    """Drain ``version``'s requests and unload it; never the stable version (409)."""
    async with manager.exclusive(model, "unload", version) as steps:
        record = manager.router.record(model)
        if record is not None and record.stable == version:
            raise Conflict(
                f"version {version} is the stable version of model '{model}'; activate another version first"
            )
        if manager.backend.state(model, version) is None:
            raise unknown_version(model, version, "not loaded")
        async with steps.run("drain"):
            drained = await manager.leases.drain(model, version, manager.drain_timeout(drain_timeout_s))
        try:
            async with steps.run("unload"):
                await manager.backend.unload(model, version)
            await note_loaded(manager, model)
        except GatewayError as exc:
            raise await failed(manager, steps, exc, {"version": version}, actor, None) from None
        manager.router.note(model, version, None)
        report = await finish(manager, steps, "ok", {"version": version}, actor)
        return report.but(drained=drained, in_flight_left=manager.leases.count(model, version))


async def note_loaded(manager: VersionContext, model: str) -> None:
    """A load or unload changed what is loaded: the record says so (other replicas converge on it)."""
    record = manager.router.record(model)
    if record is None or record.loaded == manager.loaded_now(model):
        return
    await manager.commit_routing(model, record.but(loaded=manager.loaded_now(model)))
