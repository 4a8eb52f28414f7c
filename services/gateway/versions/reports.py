"""How a version action ends: its audit event, the report the admin call answers with, and for a failure the
error that names the step (and says which version keeps serving)."""

from __future__ import annotations

from typing import Any

from services.gateway.errors import BackendUnavailable, Conflict, GatewayError, ModelNotFound, SwapFailed
from services.gateway.state import Event
from services.gateway.versions.context import VersionContext
from services.gateway.versions.progress import ActionReport, Steps


async def finish(
    manager: VersionContext,
    steps: Steps,
    result: str,
    versions: dict[str, int | None],
    actor: str,
    *,
    comparison: dict[str, Any] | None = None,
    error: str | None = None,
    generation: int | None = None,
) -> ActionReport:
    progress = steps.progress
    detail = {"comparison": comparison} if comparison else {}
    await manager.record(
        Event(progress.action, steps.model, result, versions, dict(progress.steps), None, error, actor, generation,
              detail)
    )
    report = ActionReport(steps.model, progress.action, result, versions, dict(progress.steps),
                          routing=manager.router.record(steps.model), error=error, workers=dict(progress.workers))
    manager.last[steps.model] = report
    return report


async def failed(
    manager: VersionContext,
    steps: Steps,
    exc: GatewayError,
    versions: dict[str, int | None],
    actor: str,
    serving: int | None,
) -> SwapFailed:
    step = steps.progress.step
    keeps = f"; version {serving} keeps serving" if serving is not None else ""
    target = versions.get("to", versions.get("version"))
    message = f"{steps.progress.action} of model '{steps.model}' version {target} failed at step '{step}': {exc}"
    await manager.record(Event(steps.progress.action, steps.model, "failed", versions, dict(steps.progress.steps),
                             step, str(exc), actor, None))
    manager.last[steps.model] = ActionReport(steps.model, steps.progress.action, "failed", versions,
                                          dict(steps.progress.steps), step=step, error=str(exc),
                                          routing=manager.router.record(steps.model),
                                          workers=dict(steps.progress.workers))
    # 404 / 409 as they came; 503 when the backend itself is unavailable (retry later); anything else is
    # the version's own fault (a corrupt file, a failed warm-up): 422.
    status = exc.status if isinstance(exc, ModelNotFound | Conflict | BackendUnavailable) else 422
    return SwapFailed(message + keeps, step, status)
