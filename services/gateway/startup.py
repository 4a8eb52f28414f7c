"""What the gateway loads and routes when it starts: the versions the config's policy selects and those the
persisted routing names, each warmed up; the persisted routing when its stable version is still there."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from services.gateway.errors import GatewayError
from services.gateway.progress import GATEWAY, Progress, Steps
from services.gateway.state import Event, RoutingRecord, StateError
from services.gateway.types import VersionState

if TYPE_CHECKING:
    from services.gateway.manager import VersionManager

log = logging.getLogger(__name__)


async def start_models(manager: VersionManager) -> None:
    records = dict(await manager.store.load_routing())
    await asyncio.to_thread(manager.catalog.scan)
    initial: dict[str, set[int]] = {}
    for name, entry in manager.catalog.entries.items():
        if entry.problem is not None or not entry.available:
            log.error("model '%s' is unavailable: %s", name, entry.problem or f"no version folder in {entry.path}")
            continue
        record = records.get(name)
        if record is not None and record.unloaded:  # stays unloaded, as Triton keeps a model it was told to unload
            manager.set_routing(name, record)
            continue
        # What the replicas keep loaded, when the record says; else what the version policy selects.
        recorded = set(record.loaded) & set(entry.available) if record is not None else set()
        wanted = recorded or set(entry.selected)
        if record is not None:
            named = (record.stable, record.previous, record.canary and record.canary.version,
                     record.shadow and record.shadow.version)
            wanted |= {v for v in named if v is not None and v in entry.available}
        initial[name] = wanted
    await manager.backend.start(initial)
    for name, versions in initial.items():
        for version in sorted(versions):
            await _warm(manager, name, version)
        await _route(manager, name, records.get(name), versions)


async def _warm(manager: VersionManager, model: str, version: int) -> None:
    state = manager.backend.state(model, version)
    if state is not VersionState.READY:
        reason = manager.backend.problem(model, version) or (state or VersionState.UNAVAILABLE).value.lower()
        log.error("model '%s' version %d is not serving: %s", model, version, reason)
        return
    try:
        await manager.warm(model, version, Steps(model, manager.metrics, Progress("startup", version)))
    except GatewayError as exc:
        await manager.quietly(manager.backend.unload(model, version), f"unloading version {version}")
        log.error("model '%s' version %d failed its warm-up and was unloaded: %s", model, version, exc)


async def _route(manager: VersionManager, model: str, record: RoutingRecord | None, versions: set[int]) -> None:
    """The persisted routing when its stable version is still on disk; else the highest version that loaded
    among those the policy selects (the policy's own choice when none did, e.g. Triton is still down)."""
    error = None
    if record is not None and record.stable in versions:
        manager.set_routing(model, record)
        return
    if record is not None:
        error = f"the persisted stable version {record.stable} is gone from the repository"
    entry = manager.catalog.entry(model)
    ready = [v for v in entry.selected if manager.backend.state(model, v) is VersionState.READY]
    if not ready and manager.router.problem(model) is not None:
        return  # nothing it could route to serves, and the reason is known: reported, not routed
    candidates = ready or list(entry.selected)
    if not candidates:
        return
    stable = max(candidates)
    routed = RoutingRecord(
        stable=stable,
        previous=record.stable if record is not None else None,
        generation=record.generation + 1 if record is not None else 1,
        loaded=manager.loaded_now(model),
    )
    try:
        await manager.store.save_routing(model, routed)
    except StateError as exc:
        log.error("routing of model '%s' is not persisted: %s", model, exc)
    manager.set_routing(model, routed)
    if error:
        log.error("model '%s': %s; serving version %d", model, error, stable)
    await manager.record(Event("startup", model, "ok", {"stable": stable}, error=error, actor=GATEWAY,
                             generation=routed.generation))
