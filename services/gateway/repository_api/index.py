"""The repository index: every model of the repository with each version on disk or loaded, in Triton's states
(``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE``) and with the reason the gateway knows for the state (for a
``READY`` version, a note when its invented warm-up failed)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.gateway.tensors.types import VersionState
from services.gateway.versions.routing import UNLOADED

if TYPE_CHECKING:
    from services.gateway.versions.manager import VersionManager

READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
_LOAD_STEPS = ("load", "warmup")
_UNLOAD_STEPS = ("drain", "unload")


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    """Empty for a model without any version folder (Triton leaves ``version`` out then)."""
    state: str
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """Triton's HTTP shape: ``version`` and ``reason`` only when they say something."""
        found: dict[str, Any] = {"name": self.name}
        if self.version:
            found["version"] = self.version
        found["state"] = self.state
        if self.reason:
            found["reason"] = self.reason
        return found


def repository_index(
    manager: VersionManager, unloading: Mapping[str, Set[int]], *, ready_only: bool
) -> list[IndexEntry]:
    """``unloading``: the versions a repository unload (or a load that drops them) is draining or unloading now."""
    found: list[IndexEntry] = []
    every = manager.backend.models()
    for name in sorted(manager.catalog.entries):
        entry = manager.catalog.entries[name]
        states = every.get(name, {})
        versions = sorted(set(entry.available) | set(states))
        if not versions:
            reason = manager.router.problem(name) or f"no version folder in the repository's '{name}' folder"
            found.append(IndexEntry(name, "", UNAVAILABLE, reason))
            continue
        leaving = _leaving(manager, name, unloading)
        for version in versions:
            state, reason = _state(manager, name, version, states.get(version), leaving)
            found.append(IndexEntry(name, str(version), state, reason))
    return [entry for entry in found if entry.state == READY] if ready_only else found


def _state(
    manager: VersionManager, model: str, version: int, state: VersionState | None, leaving: Set[int]
) -> tuple[str, str]:
    running = manager.progress.get(model)
    arriving = running is not None and running.version == version and running.step in _LOAD_STEPS
    # A version warming up without an action of this gateway's (one it follows: a replica's, worker 0's) arrives too.
    router = manager.router
    arriving = arriving or (router.is_warming(model, version) and not router.is_evicting(model, version))
    if state is VersionState.READY:
        if version in leaving:
            return UNLOADING, ""
        # A version that serves has no reason in Triton's index; the gateway's note (its invented warm-up failed)
        # takes the field, the only free text both protocols' index answers carry.
        return (LOADING, "warming up") if arriving else (READY, manager.notes.get(model, version) or "")
    if state is VersionState.LOADING or arriving:
        return LOADING, ""
    record = manager.router.record(model)
    problem = manager.router.problem(model, version)
    if problem is None and record is not None and record.unloaded:
        problem = UNLOADED
    if problem is None and manager.cache is not None and record is not None and version == record.stable:
        problem = manager.cache.reason(model)
    return UNAVAILABLE, problem or "not loaded"


def _leaving(manager: VersionManager, model: str, unloading: Mapping[str, Set[int]]) -> Set[int]:
    """Versions on their way out: a repository action's, or the one an admin unload is draining."""
    running = manager.progress.get(model)
    if running is not None and running.action == "unload" and running.step in _UNLOAD_STEPS:
        return {*unloading.get(model, ()), *(() if running.version is None else (running.version,))}
    return unloading.get(model, set())
