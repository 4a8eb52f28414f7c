"""The gateway follows its repository: a model that appears is loaded at its policy's versions and routed, as
Triton's poll mode would; a new version of a served model is only listed, and serves once someone activates it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from services.gateway.errors import GatewayError
from services.gateway.state import Event, RoutingRecord
from services.gateway.tensors.types import VersionState
from services.gateway.versions.context import VersionContext
from services.gateway.versions.first_stable import first_stable
from services.gateway.versions.progress import GATEWAY
from services.gateway.versions.reports import finish

log = logging.getLogger(__name__)


async def poll(manager: VersionContext) -> None:
    """Scan every ``repository_poll_s`` until cancelled."""
    while True:
        await asyncio.sleep(manager.settings.repository_poll_s)
        try:
            await scan_repository(manager, GATEWAY)
        except Exception:  # the poller must outlive any surprise; the next period tries again
            log.exception("repository scan failed")


async def scan_repository(manager: VersionContext, actor: str) -> dict[str, Any]:
    """Read the repository again. A new model is loaded at its policy's versions and routed, as Triton's poll
    mode would; a new version of a known model is only listed: it serves once someone activates it."""
    found = await asyncio.to_thread(manager.catalog.scan)
    introduced = {}
    for model in found.new_models:
        introduced[model] = await _introduce(manager, model, actor)
    for model, versions in found.new_versions.items():
        log.info("model '%s': version(s) %s appeared in the repository (not served until activated)",
                 model, list(versions))
        await manager.record(Event("scan", model, "ok", detail={"new_versions": list(versions)}, actor=actor))
    for model in found.missing_models:
        log.warning("model '%s' is gone from the repository; its loaded versions keep serving", model)
    return {
        "new_models": introduced,
        "new_versions": {m: list(v) for m, v in found.new_versions.items()},
        "missing_models": list(found.missing_models),
    }


async def _introduce(manager: VersionContext, model: str, actor: str) -> dict[str, Any]:
    entry = manager.catalog.entry(model)
    if entry.problem is not None or not entry.selected:
        problem = entry.problem or f"no version folder in {entry.path}"
        log.error("model '%s' is unavailable: %s", model, problem)
        return {"problem": problem}
    choice = first_stable(entry)
    wanted = sorted({*entry.selected, *choice.candidates})
    async with manager.exclusive(model, "discover", max(wanted)) as steps:
        for version in wanted:
            try:
                await manager.prepare(model, version, steps)
            except GatewayError as exc:
                log.error("model '%s' version %d: %s", model, version, exc)
        ready = [v for v in wanted if manager.backend.state(model, v) is VersionState.READY]
        stable = choice.pick(lambda v: v in ready)
        if stable is not None and stable not in ready:
            report = await finish(manager, steps, "failed", {}, actor, error=manager.router.problem(model))
            return {"problem": report.error}
        if stable is None:
            log.error("model '%s' serves no unversioned request: %s", model, choice.rule)
            manager.router.unrouted(model, choice.rule)
            await finish(manager, steps, "unchanged", {}, actor, error=choice.rule)
            return {"problem": choice.rule, "loaded": ready}
        log.info("model '%s': stable version %d, %s", model, stable, choice.rule)
        routed = RoutingRecord(stable=stable, loaded=manager.loaded_now(model))
        await manager.commit_routing(model, routed)
        await finish(manager, steps, "ok", {"stable": routed.stable}, actor, generation=routed.generation)
        return {"stable": routed.stable, "loaded": ready}
