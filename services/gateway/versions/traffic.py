"""A model's traffic policies at run time: set or clear its canary split and its shadow version (the version is
loaded and warmed up through the swap protocol before any request reaches it), and the canary's watch: the bounds
that pull a misbehaving canary back, and the promotion of one that behaved for ``promote_after_s``. The windows
the watch reads are in ``windows``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from services.gateway.errors import Conflict, GatewayError, InvalidInput
from services.gateway.state import Event, RoutingRecord
from services.gateway.state.policies import CanaryPolicy, InferenceLogPolicy, ShadowPolicy
from services.gateway.state.records import now_iso
from services.gateway.tensors.types import VersionState
from services.gateway.versions.comparison import compare_versions
from services.gateway.versions.context import VersionContext
from services.gateway.versions.progress import GATEWAY, ActionReport, Steps
from services.gateway.versions.reports import failed
from services.gateway.versions.windows import Figures

log = logging.getLogger(__name__)
CHECK_PERIOD_S = 0.5

_Policy = TypeVar("_Policy", CanaryPolicy, ShadowPolicy)


async def set_canary(manager: VersionContext, model: str, canary: CanaryPolicy | None, actor: str) -> ActionReport:
    """``None`` or a weight of 0 clears the split (the canary version stays loaded)."""

    def started(policy: CanaryPolicy) -> CanaryPolicy:
        # Stamped once the canary is ready to serve: the promotion clock and the rollback window count from here.
        return dataclasses.replace(policy, since=now_iso(), rolled_back=None)

    clears = canary is None or canary.weight == 0
    return await _set_policy(manager, model, "traffic", canary, clears, actor, kind="canary", started=started)


async def set_shadow(manager: VersionContext, model: str, shadow: ShadowPolicy | None, actor: str) -> ActionReport:
    """``None`` (or a sample of 0) stops shadowing (the shadow version stays loaded)."""
    clears = shadow is None or shadow.sample == 0
    return await _set_policy(manager, model, "shadow", shadow, clears, actor, kind="shadow")


async def set_inference_log(
    manager: VersionContext, model: str, policy: InferenceLogPolicy | None, actor: str
) -> ActionReport:
    """The model's own inference-log sample and redactions (``None``: back to the gateway's settings), in its routing
    record: every replica and worker logs by the same policy from the moment the record is committed."""
    async with manager.exclusive(model, "inference_log", None, actor) as steps:
        record = _routed(manager, model)
        if record.inference_log == policy:
            return _unchanged(manager, steps, record)
        detail = {"inference_log": None if policy is None else policy.to_json()}
        return await _commit(manager, steps, record.but(inference_log=policy), actor, detail)


async def _set_policy(
    manager: VersionContext,
    model: str,
    action: str,
    policy: _Policy | None,
    clears: bool,
    actor: str,
    *,
    kind: Literal["canary", "shadow"],
    started: Callable[[_Policy], _Policy] | None = None,
) -> ActionReport:
    """The routing record's ``kind`` policy becomes ``policy`` (as ``started`` stamps it, if given) once its version
    is loaded and warmed up, or none when the request ``clears`` it; ``action`` names the action in its progress and
    its event."""
    async with manager.exclusive(model, action, policy.version if policy else None, actor) as steps:
        record = _routed(manager, model)
        if policy is None or clears:
            if getattr(record, kind) is None:
                return _unchanged(manager, steps, record)
            return await _commit(manager, steps, record.but(**{kind: None}), actor, {kind: None})
        if policy.version == record.stable:
            raise InvalidInput(f"version {policy.version} is the stable version of model '{model}'; pick another")
        # Loaded by this action: its export is the one on disk now; else the one it was loaded as.
        fresh = () if manager.backend.state(model, policy.version) is VersionState.READY else (policy.version,)
        # No comparison: live traffic is the comparison (the canary's rollback bounds, the shadow's compared answers).
        await _prepare(manager, steps, model, policy.version, record, actor, compare=False)
        serving = started(policy) if started else policy
        return await _commit(manager, steps, record.but(**{kind: serving}), actor, {kind: dataclasses.asdict(serving)},
                             fresh=fresh)


async def pull_back_canary(
    manager: VersionContext, model: str, broken: Breach, stable: Figures, trial: Figures
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


def _unchanged(manager: VersionContext, steps: Steps, record: RoutingRecord) -> ActionReport:
    """Clearing what is not set: nothing to persist or record."""
    versions: dict[str, int | None] = {"stable": record.stable}
    report = ActionReport(steps.model, steps.progress.action, "unchanged", versions, {}, routing=record)
    manager.last[steps.model] = report
    return report


def _routed(manager: VersionContext, model: str) -> RoutingRecord:
    record = manager.router.record(model)
    if record is None:
        raise Conflict(f"model '{model}' has no routing yet (no version of it serves)")
    if record.unloaded:
        raise Conflict(f"model '{model}' was unloaded through the repository API; load or activate it first")
    return record


async def _prepare(
    manager: VersionContext, steps: Steps, model: str, version: int, record: RoutingRecord, actor: str, compare: bool
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
    manager: VersionContext,
    steps: Steps,
    routed: RoutingRecord,
    actor: str,
    detail: Mapping[str, Any],
    *,
    fresh: tuple[int, ...] = (),
) -> ActionReport:
    routed = dataclasses.replace(routed, loaded=manager.loaded_now(steps.model))
    async with steps.run("flip"):
        routed = await manager.commit_routing(steps.model, routed, fresh=fresh)
    action, timings = steps.progress.action, dict(steps.progress.steps)
    versions: dict[str, int | None] = {"stable": routed.stable}
    event = Event(action, steps.model, "ok", versions, timings, actor=actor, generation=routed.generation,
                  detail=dict(detail))
    await manager.record(event)
    report = ActionReport(steps.model, action, "ok", versions, timings, routing=routed)
    manager.last[steps.model] = report
    return report


@dataclass(frozen=True)
class Breach:
    reason: str
    """``error_rate`` or ``p99_ratio``: the label of ``switchyard_canary_rollbacks_total``."""
    detail: str


def breach(canary: CanaryPolicy, stable: Figures, trial: Figures) -> Breach | None:
    """The first bound the canary breaks, judged once it has ``min_requests`` (and, for the latency ratio, the
    stable side too)."""
    bounds = canary.rollback
    if bounds is None or trial.requests < bounds.min_requests:
        return None
    if bounds.max_error_rate is not None and trial.error_rate > bounds.max_error_rate:
        return Breach(
            "error_rate",
            f"canary 5xx rate {trial.error_rate:.1%} over {trial.requests} requests is above "
            f"{bounds.max_error_rate:.1%} (stable: {stable.error_rate:.1%} over {stable.requests})",
        )
    limit, baseline, latency = bounds.max_p99_ratio, stable.p99_s, trial.p99_s
    if limit is not None and stable.requests >= bounds.min_requests and baseline and latency is not None:
        ratio = latency / baseline
        if ratio > limit:
            return Breach(
                "p99_ratio",
                f"canary p99 {latency * 1e3:.1f} ms is {ratio:.2f}x the stable's {baseline * 1e3:.1f} ms "
                f"(bound {limit:g}x)",
            )
    return None


async def watch_canaries(manager: VersionContext) -> None:
    """Every ``CHECK_PERIOD_S``: pull back a canary that breaks a bound, promote one that behaved long enough."""
    while True:
        await asyncio.sleep(CHECK_PERIOD_S)
        for model, record in list(manager.router.records.items()):
            canary = record.canary
            if canary is None or canary.weight <= 0:
                continue
            try:
                await _check(manager, model, record, canary)
            except Conflict:
                pass  # another action on the model runs now; the next period looks again
            except GatewayError as exc:
                log.error("canary of model '%s': %s", model, exc)
            except Exception:  # the watch must outlive any surprise
                log.exception("canary watch of model '%s' failed", model)


async def _check(manager: VersionContext, model: str, record: RoutingRecord, canary: CanaryPolicy) -> None:
    windows = manager.windows
    window_s = canary.rollback.window_s if canary.rollback is not None else 60.0
    stable = windows.figures(model, record.stable, window_s)
    trial = windows.figures(model, canary.version, window_s)
    broken = breach(canary, stable, trial)
    if broken is not None:
        await pull_back_canary(manager, model, broken, stable, trial)
        return
    if canary.promote_after_s is not None and _age_s(canary.since) >= canary.promote_after_s:
        await manager.promote(model, canary)  # checks again, under the model's lock, that the canary is ready


def _age_s(since: str) -> float:
    if not since:
        return 0.0
    started = dt.datetime.fromisoformat(since).timestamp()
    return time.time() - started
