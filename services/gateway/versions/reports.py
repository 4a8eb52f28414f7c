"""How a version action ends: its audit event, the report the admin call answers with, and for a failure the
error that names the step (and says which version keeps serving)."""

from __future__ import annotations

from typing import Any

from services.gateway.errors import BackendUnavailable, Conflict, GatewayError, ModelNotFound, SwapFailed
from services.gateway.state import Event
from services.gateway.versions.context import VersionContext
from services.gateway.versions.progress import ActionReport, Steps
from services.gateway.versions.replay_check import ReplayRefused


class ReportedSwapFailure(SwapFailed):
    """A failed version action whose answer carries more than the message and the step: ``details`` go beside
    them in the JSON (the replay check's report, so that the operator sees which answers differed)."""

    def __init__(self, message: str, step: str, status: int, details: dict[str, Any]) -> None:
        super().__init__(message, step, status)
        self.details = details


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
    replay: dict[str, Any] | None = None,
) -> ActionReport:
    progress = steps.progress
    detail = {"comparison": comparison} if comparison else {}
    if replay is not None:
        detail["replay"] = _summary(replay)
    await manager.record(
        Event(progress.action, steps.model, result, versions, dict(progress.steps), None, error, actor, generation,
              detail)
    )
    report = ActionReport(steps.model, progress.action, result, versions, dict(progress.steps),
                          routing=manager.router.record(steps.model), error=error, workers=dict(progress.workers),
                          replay=replay)
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
    replay = exc.report if isinstance(exc, ReplayRefused) else None
    await manager.record(Event(steps.progress.action, steps.model, "failed", versions, dict(steps.progress.steps),
                             step, str(exc), actor, None, {"replay": _summary(replay)} if replay else {}))
    manager.last[steps.model] = ActionReport(steps.model, steps.progress.action, "failed", versions,
                                          dict(steps.progress.steps), step=step, error=str(exc),
                                          routing=manager.router.record(steps.model),
                                          workers=dict(steps.progress.workers), replay=replay)
    # 404 / 409 as they came; 503 when the backend itself is unavailable (retry later); anything else is
    # the version's own fault (a corrupt file, a failed warm-up): 422.
    status = exc.status if isinstance(exc, ModelNotFound | Conflict | BackendUnavailable) else 422
    if replay is not None:
        return ReportedSwapFailure(message + keeps, step, status, {"replay": replay})
    return SwapFailed(message + keeps, step, status)


def _summary(replay: dict[str, Any]) -> dict[str, Any]:
    """What the audit log keeps of a replay report: its verdict and counts (the whole report is in the answer)."""
    keys = ("source", "passed", "records", "compared", "status_only", "differing", "status_mismatches", "atol", "rtol")
    return {key: replay.get(key) for key in keys}
