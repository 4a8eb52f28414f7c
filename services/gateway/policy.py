"""Traffic policy actions: set or clear a model's canary split and shadow version (the version is loaded and
warmed up through the swap protocol before any request reaches it), and pull back a canary that broke a bound."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from services.gateway.errors import Conflict, GatewayError, InvalidInput
from services.gateway.progress import GATEWAY, ActionReport
from services.gateway.reports import failed
from services.gateway.state import Event, RoutingRecord
from services.gateway.state.policies import CanaryPolicy, ShadowPolicy
from services.gateway.state.records import now_iso
from services.gateway.warmup import compare_versions
from services.gateway.windows import Figures

if TYPE_CHECKING:
    from services.gateway.manager import VersionManager
    from services.gateway.progress import Steps
    from services.gateway.traffic import Breach

log = logging.getLogger(__name__)


async def set_canary(manager: VersionManager, model: str, canary: CanaryPolicy | None, actor: str) -> ActionReport:
    """``None`` or a weight of 0 clears the split (the canary version stays loaded)."""
    async with manager.exclusive(model, "traffic", canary.version if canary else None) as steps:
        record = _routed(manager, model)
        if canary is None or canary.weight == 0:
            if record.canary is None:
                return _unchanged(manager, steps, record)
            return await _commit(manager, steps, record.but(canary=None), actor, {"canary": None})
        if canary.version == record.stable:
            raise InvalidInput(f"version {canary.version} is the stable version of model '{model}'; pick another")
        # No comparison: live traffic is the canary's comparison, judged by its rollback bounds.
        await _prepare(manager, steps, model, canary.version, record, actor, compare=False)
        started = dataclasses.replace(canary, since=now_iso(), rolled_back=None)
        detail = {"canary": dataclasses.asdict(started)}
        return await _commit(manager, steps, record.but(canary=started), actor, detail)


async def set_shadow(manager: VersionManager, model: str, shadow: ShadowPolicy | None, actor: str) -> ActionReport:
    """``None`` (or a sample of 0) stops shadowing (the shadow version stays loaded)."""
    async with manager.exclusive(model, "shadow", shadow.version if shadow else None) as steps:
        record = _routed(manager, model)
        if shadow is None or shadow.sample == 0:
            if record.shadow is None:
                return _unchanged(manager, steps, record)
            return await _commit(manager, steps, record.but(shadow=None), actor, {"shadow": None})
        if shadow.version == record.stable:
            raise InvalidInput(f"version {shadow.version} is the stable version of model '{model}'; pick another")
        await _prepare(manager, steps, model, shadow.version, record, actor, compare=False)
        return await _commit(manager, steps, record.but(shadow=shadow), actor, {"shadow": dataclasses.asdict(shadow)})


async def pull_back_canary(
    manager: VersionManager, model: str, broken: Breach, stable: Figures, trial: Figures
) -> None:
    """Weight to 0 at once (the policy stays, marked with why), persisted, counted and recorded."""
    async with manager.exclusive(model, "canary_rollback", None) as steps:
        record = manager.router.record(model)
        if record is None or record.canary is None or record.canary.weight <= 0:
            return
        steps.progress.version = record.canary.version
        stopped = dataclasses.replace(record.canary, weight=0.0, rolled_back=broken.detail)
        log.warning("model '%s': canary version %d pulled back: %s", model, stopped.version, broken.detail)
        manager.metrics.canary_rollbacks.labels(model, broken.reason).inc()
        detail = {"reason": broken.reason, "bound": broken.detail, "stable": stable.to_json(),
                  "canary": trial.to_json()}
        await _commit(manager, steps, record.but(canary=stopped), GATEWAY, detail)


def _unchanged(manager: VersionManager, steps: Steps, record: RoutingRecord) -> ActionReport:
    """Clearing what is not set: nothing to persist or record."""
    versions: dict[str, int | None] = {"stable": record.stable}
    report = ActionReport(steps.model, steps.progress.action, "unchanged", versions, {}, routing=record)
    manager.last[steps.model] = report
    return report


def _routed(manager: VersionManager, model: str) -> RoutingRecord:
    record = manager.router.record(model)
    if record is None:
        raise Conflict(f"model '{model}' has no routing yet (no version of it serves)")
    if record.unloaded:
        raise Conflict(f"model '{model}' was unloaded through the repository API; load or activate it first")
    return record


async def _prepare(
    manager: VersionManager, steps: Steps, model: str, version: int, record: RoutingRecord, actor: str, compare: bool
) -> dict[str, object] | None:
    """Load and warm ``version`` up as a swap would; on failure the routing is untouched and the step named."""
    try:
        warmed = await manager.prepare(model, version, steps)
        if not compare:
            return None
        async with steps.run("compare"):
            entry = manager.catalog.entry(model)
            timeout = manager.settings.warmup_timeout_s
            return await compare_versions(manager.backend, entry, version, record.stable, warmed, timeout)
    except GatewayError as exc:
        raise await failed(manager, steps, exc, {"version": version}, actor, record.stable) from None


async def _commit(
    manager: VersionManager, steps: Steps, routed: RoutingRecord, actor: str, detail: Mapping[str, Any]
) -> ActionReport:
    routed = dataclasses.replace(routed, loaded=manager.loaded_now(steps.model))
    async with steps.run("flip"):
        await manager.commit_routing(steps.model, routed)
    action, timings = steps.progress.action, dict(steps.progress.steps)
    versions: dict[str, int | None] = {"stable": routed.stable}
    event = Event(action, steps.model, "ok", versions, timings, actor=actor, generation=routed.generation,
                  detail=dict(detail))
    await manager.record(event)
    report = ActionReport(steps.model, action, "ok", versions, timings, routing=routed)
    manager.last[steps.model] = report
    return report
