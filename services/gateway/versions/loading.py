"""Loading and unloading versions without changing where unversioned requests go; the routing record notes what
is loaded, so that other replicas converge on it."""

from __future__ import annotations

from services.gateway.errors import Conflict, GatewayError, unknown_version
from services.gateway.state import RoutingRecord
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
    """Drain ``version``'s requests and unload it; never a version the routing record routes to (409): the stable
    version, nor the canary's or shadow's."""
    async with manager.exclusive(model, "unload", version) as steps:
        record = manager.router.record(model)
        if record is not None:
            refusal = routed_by(record, model, version)
            if refusal is not None:
                raise Conflict(refusal)
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


def routed_by(record: RoutingRecord, model: str, version: int) -> str | None:
    """Why ``version`` may not be unloaded while ``record`` names it, and what to do first; ``None`` when it names
    it nowhere. A canary or shadow policy outlives its version's unload otherwise: the record still names it (and a
    restart loads it again), so the split would come back by itself, or a promotion make an untried version
    stable. Ending the policy is the operator's call, as activating another version is for the stable one."""
    if record.stable == version:
        return f"version {version} is the stable version of model '{model}'; activate another version first"
    canary, shadow = record.canary, record.shadow
    if canary is not None and canary.version == version:
        share = f"{canary.weight:g}% of its traffic" if canary.weight > 0 else "weight 0, pulled back"
        return (
            f"version {version} is the canary of model '{model}' ({share}); end the split first "
            f"(switchyard models traffic {model} --clear, or PUT /admin/models/{model}/traffic "
            '{"canary": null}), then unload it'
        )
    if shadow is not None and shadow.version == version:
        return (
            f"version {version} is the shadow of model '{model}' ({shadow.percent:g}% of its requests copied to it); "
            f"stop shadowing first (switchyard models shadow {model} --clear, or PUT /admin/models/{model}/shadow "
            '{"version": null}), then unload it'
        )
    return None
