"""What the gateway persists: one routing record per model, and audit events for every version action."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeGuard

from services.gateway.state.policies import CanaryPolicy, InferenceLogPolicy, ShadowPolicy


class StateError(Exception):
    """The persisted state cannot be read or written; the message names the file (or server) and the cause."""


def now_iso() -> str:
    """UTC wall-clock time with milliseconds, as records and events carry it."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class RoutingRecord:
    """Where a model's unversioned requests go. ``generation`` grows by one with every change."""

    stable: int
    previous: int | None = None
    generation: int = 1
    updated_at: str = field(default_factory=now_iso)
    canary: CanaryPolicy | None = None
    shadow: ShadowPolicy | None = None
    loaded: tuple[int, ...] = ()
    """The versions the gateways keep loaded (empty: not recorded). Replicas converge on it: on a shared Triton it
    is the set every replica wants, so that none loads back what another unloaded."""
    unloaded: bool = False
    """Every version was unloaded through the repository API: unversioned requests get 404 until a load or an
    activation routes the model again (``stable`` is kept: the version a rollback or the audit log refers to)."""
    inference_log: InferenceLogPolicy | None = None
    """The model's own inference-log sample and redactions (``None``: the gateway's settings)."""
    exports: Mapping[int, str] = field(default_factory=dict, hash=False)
    """Which export each version the record names (stable, previous, canary, shadow) held when the record named it
    (``services.modelrepo.manifest.export_identity``): a version number can be reused by another export, which no
    start or rollback may take for the one that was activated. Empty in records from before it: their numbers are
    trusted, as they always were."""

    def named(self) -> set[int]:
        """The versions the record routes to or may roll back to: what ``exports`` covers."""
        named = {self.stable}
        for version in (self.previous, self.canary_version, self.shadow_version):
            if version is not None:
                named.add(version)
        return named

    @property
    def canary_version(self) -> int | None:
        return None if self.canary is None else self.canary.version

    @property
    def shadow_version(self) -> int | None:
        return None if self.shadow is None else self.shadow.version

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["loaded"] = list(self.loaded)
        data["inference_log"] = None if self.inference_log is None else self.inference_log.to_json()
        data["exports"] = {str(version): self.exports[version] for version in sorted(self.exports)}
        return data

    def but(self, **changes: Any) -> RoutingRecord:
        """The next record: ``changes`` applied, the generation one higher, stamped now."""
        return replace(self, **changes, generation=self.generation + 1, updated_at=now_iso())

    def switched_to(self, version: int) -> RoutingRecord:
        """The next record once ``version`` is stable: the old stable is the previous one; a canary or shadow of
        ``version`` is done with (it is the stable one now); another canary keeps its split, judged afresh."""
        canary, shadow = self.canary, self.shadow
        if canary is not None:
            canary = None if canary.version == version else replace(canary, since=now_iso())
        if shadow is not None and shadow.version == version:
            shadow = None
        return self.but(stable=version, previous=self.stable, canary=canary, shadow=shadow, unloaded=False)

    @classmethod
    def from_json(cls, data: object) -> RoutingRecord:
        """Raises ``ValueError`` naming the field when ``data`` is not a routing record."""
        if not isinstance(data, dict):
            raise ValueError("a routing record must be a JSON object")
        stable, previous, generation = data.get("stable"), data.get("previous"), data.get("generation")
        if not _version(stable):
            raise ValueError(f"'stable' must be a non-negative integer, got {stable!r}")
        if previous is not None and not _version(previous):
            raise ValueError(f"'previous' must be a non-negative integer or null, got {previous!r}")
        if not _version(generation) or not generation:
            raise ValueError(f"'generation' must be a positive integer, got {generation!r}")
        updated_at = data.get("updated_at", "")
        if not isinstance(updated_at, str):
            raise ValueError(f"'updated_at' must be a string, got {updated_at!r}")
        canary = CanaryPolicy.from_json(data["canary"]) if data.get("canary") is not None else None
        shadow = ShadowPolicy.from_json(data["shadow"]) if data.get("shadow") is not None else None
        loaded = data.get("loaded", [])
        if not isinstance(loaded, list) or not all(_version(v) for v in loaded):
            raise ValueError(f"'loaded' must be a list of non-negative integers, got {loaded!r}")
        unloaded = data.get("unloaded", False)
        if not isinstance(unloaded, bool):
            raise ValueError(f"'unloaded' must be true or false, got {unloaded!r}")
        logged = data.get("inference_log")
        inference_log = InferenceLogPolicy.from_json(logged) if logged is not None else None
        versions = tuple(sorted(set(loaded)))
        exports = _exports(data.get("exports", {}))
        return cls(stable, previous, generation, updated_at, canary, shadow, versions, unloaded, inference_log,
                   exports)


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the audit log: who did what to which model version, how it went and how long each step took."""

    action: str
    """``startup``, ``activate``, ``rollback``, ``load``, ``unload``, ``discover``, ``scan``."""
    model: str
    result: str
    """``ok``, ``failed`` or ``unchanged``."""
    versions: dict[str, int | None] = field(default_factory=dict)
    """e.g. ``{"from": 1, "to": 2}`` for a switch, ``{"version": 3}`` for a load."""
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds per completed step, in the order they ran."""
    step: str | None = None
    """The step that failed."""
    error: str | None = None
    actor: str | None = None
    """Who asked: ``token:<fingerprint>`` for an admin call (never the token), ``gateway`` for the gateway itself."""
    generation: int | None = None
    """The routing generation after the action."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (an output comparison, versions found by a scan)."""
    time: str = field(default_factory=now_iso)
    """When it happened, as recorded: an event written to the store later keeps it."""
    pending: bool = False
    """Only in reads: this gateway recorded it but the shared store (Redis) has not taken it yet, so the other
    replicas do not show it yet (``redis_store``). Never stored, and left out of the JSON when false."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.pending:
            del data["pending"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        # ``pending`` is this gateway's knowledge, never a stored event's.
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data and name != "pending"})


def _exports(raw: object) -> dict[int, str]:
    """A record's ``exports``: version numbers (JSON keys are strings) to export identities."""
    if not isinstance(raw, dict) or not all(
        isinstance(key, str) and key.isascii() and key.isdigit() and isinstance(value, str) and value
        for key, value in raw.items()
    ):
        raise ValueError(f"'exports' must map version numbers to export identities, got {raw!r}")
    return {int(key): value for key, value in raw.items()}


def _version(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
