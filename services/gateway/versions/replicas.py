"""Several gateways sharing one state store (Redis): each follows the routing the others write. A follower makes
the versions the new record names servable before it routes to them, and keeps serving the old routing
meanwhile (or when it cannot): the embedded backend loads and warms them itself; on a shared Triton the replica
that ran the action loaded them, and the others adopt what Triton serves."""

from __future__ import annotations

import asyncio
import logging
import time

from services.gateway.errors import GatewayError, ModelNotFound
from services.gateway.state import RoutingRecord
from services.gateway.tensors.types import VersionState
from services.gateway.versions.context import VersionContext
from services.gateway.versions.exports import on_disk, replaced
from services.gateway.versions.progress import Progress, Steps

log = logging.getLogger(__name__)
RETRY_AFTER_FAILURE_S = 30.0
"""A routing generation this gateway failed to follow is tried again after this long, not at every poll."""


async def follow(manager: VersionContext, model: str, record: RoutingRecord) -> None:
    """Take ``record`` (written by another gateway) when it is newer than ours, or the shared one this gateway could
    not take yet; never raises."""
    if _taken(manager, model, record):
        return
    failed_at = manager.follow_failures.get((model, record.generation))
    if failed_at is not None and time.monotonic() - failed_at < RETRY_AFTER_FAILURE_S:
        return
    async with manager.lock(model):
        await _adopt(manager, model, record)


async def adopt(manager: VersionContext, model: str, record: RoutingRecord) -> str | None:
    """Take ``record`` now (the node's acting worker committed it: ``versions/node.py``); why not, when it cannot."""
    async with manager.lock(model):
        return await _adopt(manager, model, record)


async def catch_up(manager: VersionContext, model: str) -> None:
    """Before an action (its store lock held): take a newer record than ours first, so that the action builds on
    the latest routing and its generation follows it."""
    latest = (await manager.store.load_routing()).get(model)
    current = manager.router.record(model)
    newer = latest is not None and (current is None or latest.generation > current.generation)
    why = await _adopt(manager, model, latest) if newer and latest is not None else None
    if why is not None:
        raise GatewayError(
            f"model '{model}': this gateway cannot serve the routing another one set ({why}), and an action builds "
            "on that routing: act through a gateway that serves it, or once this one's repository holds what it names",
            503,
        )


async def _adopt(manager: VersionContext, model: str, record: RoutingRecord) -> str | None:
    """None once routed by ``record`` (or a newer one), else why not."""
    current = manager.router.record(model)
    if _taken(manager, model, record):
        return None
    needed = set() if record.unloaded else {record.stable}
    if record.canary is not None and record.canary.weight > 0:
        needed.add(record.canary.version)
    if record.shadow is not None:
        needed.add(record.shadow.version)
    target = set(record.loaded) | needed
    try:
        if model not in manager.catalog.entries:
            await asyncio.to_thread(manager.catalog.scan)
        _same_exports(record, await asyncio.to_thread(on_disk, manager.catalog.entry(model), needed))
        if manager.backend.shared_server:
            await manager.backend.adopt(model, target)
            missing = sorted(v for v in needed if manager.backend.state(model, v) is not VersionState.READY)
            if missing:
                raise GatewayError(f"version(s) {missing} are not ready on the shared server", 503)
        elif manager.cache is None or model in manager.cache.pinned:
            steps = Steps(model, manager.metrics, Progress("follow", record.stable))
            target = needed | await _held_here(manager, model, record, target - needed)
            for version in sorted(target):
                await manager.prepare(model, version, steps)
        else:  # the model cache loads what the record routes to on its first request here: from this repository
            for version in sorted(needed):
                await asyncio.to_thread(manager.catalog.refresh, model, version)  # 404 naming it when it is not there
    except GatewayError as exc:
        manager.follow_failures[model, record.generation] = time.monotonic()
        serving = current.stable if current is not None else None
        log.error(
            "model '%s': not following routing generation %d (stable %d) set by another gateway: %s; still serving "
            "version %s", model, record.generation, record.stable, exc, serving,
        )
        manager.behind[model] = (
            record.generation,
            f"this gateway does not serve routing generation {record.generation} (stable {record.stable}) that "
            f"another gateway set: {exc}; it serves version {serving} meanwhile and tries again every "
            f"{RETRY_AFTER_FAILURE_S:g} s",
        )
        return f"cannot take routing generation {record.generation} (stable {record.stable}): {exc}"
    manager.set_routing(model, record)
    log.info("model '%s': following routing generation %d: stable %d", model, record.generation, record.stable)
    # With the model cache what stays loaded here is its own business, except a model unloaded on purpose.
    kept_by_record = record.loaded and manager.cache is None
    if (kept_by_record or record.unloaded) and not manager.backend.shared_server:
        await _unload_extras(manager, model, target)
    return None


async def _held_here(manager: VersionContext, model: str, record: RoutingRecord, kept: set[int]) -> set[int]:
    """Of the versions the record keeps loaded without routing to them (the previous one, for a quick rollback),
    those this gateway's repository holds. One missing here (pruned from this copy) does not keep the gateway from
    following what the record routes to; it matters only when an action routes to it, and that action says so."""
    held = set()
    for version in sorted(kept):
        try:
            await asyncio.to_thread(manager.catalog.refresh, model, version)
        except ModelNotFound as exc:
            log.warning("model '%s': routing generation %d keeps version %d loaded, which this gateway's repository "
                        "lacks (%s); following without it", model, record.generation, version, exc)
            continue
        held.add(version)
    return held


def _taken(manager: VersionContext, model: str, record: RoutingRecord) -> bool:
    """Whether this gateway routes by ``record`` or a newer one: its generation is not above ours, and it is not the
    one this gateway is behind (a start that could not serve the shared record serves its own at that generation)."""
    current = manager.router.record(model)
    if current is None or record.generation > current.generation:
        return False
    behind = manager.behind.get(model)
    return behind is None or record.generation < behind[0]


def _same_exports(record: RoutingRecord, disk: dict[int, str]) -> None:
    """Refuse to serve a routing whose versions are other exports in this gateway's repository than in the one of
    the gateway that set it (a copy of the repository out of step): the same number would answer differently here."""
    other = [f"version {v}'s files here are {why}" for v in sorted(disk) if (why := replaced(record, disk, v))]
    if other:
        raise GatewayError(f"this gateway's repository holds other exports: {'; '.join(other)}", 503)


async def _unload_extras(manager: VersionContext, model: str, keep: set[int]) -> None:
    """Versions the other gateways unloaded go here too, once their requests on this one have finished."""
    for version, state in list(manager.backend.models().get(model, {}).items()):
        if version in keep or state is not VersionState.READY:
            continue
        await manager.leases.drain(model, version, manager.settings.drain_timeout_s)
        try:
            await manager.backend.unload(model, version)
        except GatewayError as exc:
            log.error("model '%s': unloading version %d as the other gateways did failed: %s", model, version, exc)
