"""What the admin API shows of a model: routing, loaded versions (state, leases, problem), versions on disk,
the action running now and the last one."""

from __future__ import annotations

import dataclasses
from typing import Any

from services.gateway.tensors.types import VersionState
from services.gateway.versions.manager import VersionManager


def model_status(manager: VersionManager, model: str) -> dict[str, Any]:
    entry = manager.catalog.entry(model)
    record = manager.router.record(model)
    states = manager.backend.models().get(model, {})
    running = manager.progress.get(model)
    last = manager.last.get(model)
    devices = getattr(manager.backend, "devices", None)  # the embedded backend places its instances; Triton its own
    loaded = []
    for version in sorted(states):
        loaded.append(
            {
                "version": version,
                "state": _shown_state(manager, model, version, states[version]),
                "leases": manager.leases.count(model, version),
                "on_disk": version in entry.available,
                "problem": manager.router.problem(model, version),
                "note": manager.notes.get(model, version),
                "devices": devices(model, version) if devices is not None else None,
            }
        )
    return {
        "name": model,
        "platform": entry.platform,
        "traffic": _traffic(manager, model),
        "ready": manager.router.ready(model),
        "routing": record.to_json() if record is not None else None,
        "loaded": loaded,
        "available": list(entry.available),
        "unreleased": [v for v in entry.available if v not in entry.released],
        "selected_by_policy": list(entry.selected),
        "problem": _problem(manager, model),
        "failed": {str(version): why for version, why in manager.router.failures(model).items()},
        "action": running.to_json() if running is not None else None,
        "last_action": last.to_json() if last is not None else None,
        "last_replay": manager.last_replay.get(model),
        "cache": _cache(manager, model),
    }


WARMING, UNLOADING = "WARMING", "UNLOADING"
"""The states the admin API shows beside the backend's: a loaded version not served yet (its warm-up runs, on the
gateway that acts or on one following it) or no longer (the model cache unloads it)."""


def _shown_state(manager: VersionManager, model: str, version: int, state: VersionState) -> str:
    if state is VersionState.READY:
        if manager.router.is_evicting(model, version):
            return UNLOADING
        if manager.router.is_warming(model, version):
            return WARMING
    return state.value


def overview(manager: VersionManager) -> dict[str, Any]:
    models = []
    for name in sorted(manager.catalog.entries):
        status = model_status(manager, name)
        routing = status["routing"] or {}
        models.append(
            {
                "name": name,
                "ready": status["ready"],
                "stable": routing.get("stable"),
                "previous": routing.get("previous"),
                "generation": routing.get("generation"),
                "canary": routing.get("canary"),
                "shadow": routing.get("shadow"),
                # Loaded means serving here: a version that failed stays out of it and is in ``problem``.
                "loaded": [v["version"] for v in status["loaded"] if v["state"] == VersionState.READY.value],
                "available": status["available"],
                "unreleased": status["unreleased"],
                "problem": status["problem"],
                "action": status["action"],
                "cache": status["cache"],
            }
        )
    cache = manager.cache
    return {"models": models, "cache": cache.summary() if cache is not None else None}


def _problem(manager: VersionManager, model: str) -> str | None:
    """Why the model does not serve; while it serves, the versions on disk that failed to load or warm up, and a
    routing another gateway set that this one could not take (it serves its own meanwhile: the replicas differ)."""
    router = manager.router
    behind = manager.behind.get(model)
    if not router.ready(model):
        return "; ".join(p for p in (router.problem(model), behind and behind[1]) if p) or None
    failed = [f"version {v} does not serve: {reason}" for v, reason in router.failures(model).items()]
    return "; ".join([*failed, behind[1]] if behind else failed) or None


def _cache(manager: VersionManager, model: str) -> dict[str, Any] | None:
    """The model cache's view of the model (``SWITCHYARD_MODEL_CACHE_MB``): resident or not, its memory (measured,
    declared or estimated; when not resident, what its last load cost), seconds since its last request, pinned."""
    return manager.cache.view(model) if manager.cache is not None else None


def _traffic(manager: VersionManager, model: str) -> dict[str, Any] | None:
    """The canary split and shadow version, with the live window figures of both sides of the split."""
    record = manager.router.record(model)
    if record is None or (record.canary is None and record.shadow is None):
        return None
    view: dict[str, Any] = {"canary": None, "shadow": None}
    if record.shadow is not None:
        view["shadow"] = {"version": record.shadow.version, "percent": record.shadow.percent,
                          "sample": record.shadow.sample}
    canary = record.canary
    if canary is not None:
        window_s = canary.rollback.window_s if canary.rollback is not None else 60.0
        view["canary"] = {
            **dataclasses.asdict(canary),
            "window": {
                "seconds": window_s,
                "stable": manager.windows.figures(model, record.stable, window_s).to_json(),
                "canary": manager.windows.figures(model, canary.version, window_s).to_json(),
            },
        }
    return view
