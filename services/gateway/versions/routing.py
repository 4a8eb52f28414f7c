"""The router: which version serves a request. Unversioned requests follow the model's routing record (its
``stable`` version); ``/versions/{v}`` requests go to ``v`` when it is loaded, ready and warmed up."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping

from services.gateway.backends.base import Backend
from services.gateway.errors import (
    ModelNotReady,
    model_not_ready,
    no_available_versions,
    unknown_model,
    unknown_version,
    version_not_ready,
)
from services.gateway.repository import Catalog
from services.gateway.state import RoutingRecord
from services.gateway.state.policies import CanaryPolicy
from services.gateway.tensors.types import VersionState

UNLOADED = "unloaded through the repository API (load it again to serve it)"
COLD = "not loaded: the model cache loads it on its first request"
Header = Callable[[str], str | None]
"""Looks up one request header (lowercase name) or gRPC metadata key; ``None`` when absent."""


def _canary_side(canary: CanaryPolicy, header: Header | None) -> bool:
    """Whether this request goes to the canary: by the sticky header's value when it has one (the same value, the
    same side, on every gateway replica), else at random."""
    value = header(canary.sticky_header) if canary.sticky_header is not None and header is not None else None
    if value:
        digest = hashlib.blake2b(value.encode(), digest_size=8).digest()
        point = int.from_bytes(digest, "big") % 10_000 / 100.0
    else:
        point = random.random() * 100.0
    return point < canary.weight


class ColdVersion(ModelNotReady):
    """The version a request routes to is not loaded, and the model cache loads versions on demand: the data plane
    waits for it (``ModelCache.fault_in``); a caller that does not answers 503 saying so."""

    def __init__(self, model: str, version: int) -> None:
        super().__init__(f"model '{model}' version {version} is {COLD}")
        self.model = model
        self.routed = version


class Router:
    """Holds the routing records in memory. A flip replaces one record object: a request routed before it sees the
    old record, one routed after sees the new one, nothing in between (everything runs on one event loop)."""

    def __init__(self, catalog: Catalog, backend: Backend) -> None:
        self._catalog = catalog
        self._backend = backend
        self._records: dict[str, RoutingRecord] = {}
        self._warming: set[tuple[str, int]] = set()
        self._notes: dict[tuple[str, int], str] = {}
        self._unrouted: dict[str, str] = {}
        self._evicting: set[tuple[str, int]] = set()
        self.on_demand = False
        """The model cache is on: a routed version that is not loaded is loaded for the request (``ColdVersion``),
        and a model whose routed version is not loaded is ready all the same."""
        self.prefetch: Callable[[str, int], None] | None = None
        """The model cache's background load, for a canary version that is not loaded (its share goes to the
        stable version meanwhile)."""

    @property
    def records(self) -> Mapping[str, RoutingRecord]:
        return self._records

    def record(self, model: str) -> RoutingRecord | None:
        return self._records.get(model)

    def set(self, model: str, record: RoutingRecord) -> None:
        self._records[model] = record
        self._unrouted.pop(model, None)

    def route(self, model: str, version: int | None, header: Header | None = None) -> int:
        """The version a request is served by: 404 when the model or the pinned version is unknown or not loaded,
        503 when it cannot serve now (loading, warming up, its server down), with the reason when one is known.
        ``header`` reads the request's headers (gRPC: metadata) for a sticky canary split."""
        pinned = version is not None
        if version is None:
            record = self._records.get(model)
            if record is None:
                if model not in self._catalog.entries:
                    raise unknown_model(model)
                raise model_not_ready(model, self.problem(model) or "none is ready yet (loading)")
            if record.unloaded:  # as Triton answers for a model unloaded through its repository API
                raise no_available_versions(model, UNLOADED)
            version = record.stable
            canary = record.canary
            if canary is not None and canary.weight > 0 and _canary_side(canary, header):
                # A canary that cannot serve right now (its server lost it) leaves its share on the stable version.
                state = self._backend.state(model, canary.version)
                if state is VersionState.READY and (model, canary.version) not in self._warming:
                    return canary.version
                if state is None and self.prefetch is not None:
                    self.prefetch(model, canary.version)
        elif model not in self._catalog.entries:
            raise unknown_model(model)
        state = self._backend.state(model, version)
        if state is VersionState.READY and (model, version) not in self._warming:
            return version
        if self.on_demand and state is not VersionState.UNAVAILABLE and self._routed(model, version):
            raise ColdVersion(model, version)  # not loaded, or being loaded, warmed up or unloaded: wait for it
        problem = self.problem(model, version)
        if state is None and pinned and problem is None:  # a version that failed to load is known, as in Triton
            loaded = ", ".join(str(v) for v in sorted(self._backend.models().get(model, {}))) or "none"
            detail = f"loaded versions: {loaded}"
            if version in self._catalog.entries[model].available:  # Triton says "not found" alike: say which it is
                detail += (f"; version {version} is in the repository but not loaded: "
                           f"switchyard models load {model} {version} (or activate it)")
            raise unknown_version(model, version, detail)
        detail = "warming up" if state is VersionState.READY else (state or VersionState.UNAVAILABLE).value.lower()
        raise version_not_ready(model, version, f"{detail}: {problem}" if problem else detail)

    def routes_to(self, model: str, version: int) -> bool:
        """Whether unversioned requests go to ``version`` now (as stable, canary or shadow)."""
        return self._routed(model, version)

    def _routed(self, model: str, version: int) -> bool:
        """Whether unversioned requests go to ``version`` (its stable version, or its canary's or shadow's)."""
        record = self._records.get(model)
        if record is None or record.unloaded:
            return False
        canary, shadow = record.canary, record.shadow
        return version in (record.stable, canary and canary.version, shadow and shadow.version)

    def evicting(self, model: str, version: int, on: bool) -> None:
        """The model cache is unloading ``version``: requests routed to it wait for it to be loaded again."""
        if on:
            self._evicting.add((model, version))
            self._warming.add((model, version))  # off the request path's fast branch, with no lookup added to it
        else:
            self._evicting.discard((model, version))
            self._warming.discard((model, version))

    def warming(self, model: str, version: int, on: bool) -> None:
        """A loaded version is not served to pinned requests until its warm-up has run."""
        if on:
            self._warming.add((model, version))
        else:
            self._warming.discard((model, version))

    def is_warming(self, model: str, version: int) -> bool:
        """A loaded version whose warm-up has not run yet (or the model cache is unloading): not served yet."""
        return (model, version) in self._warming

    def is_evicting(self, model: str, version: int) -> bool:
        """The model cache is unloading ``version``."""
        return (model, version) in self._evicting

    def note(self, model: str, version: int, problem: str | None) -> None:
        """Remember why a version is not served (its warm-up failed), beside what the backend knows."""
        if problem is None:
            self._notes.pop((model, version), None)
        else:
            self._notes[model, version] = problem

    def unrouted(self, model: str, reason: str) -> None:
        """Say why a model that loaded has no stable version (none is released); routing it clears this."""
        self._unrouted[model] = reason

    def problem(self, model: str, version: int | None = None) -> str | None:
        entry = self._catalog.entries.get(model)
        if entry is not None and entry.problem is not None:
            return entry.problem
        if version is None and model not in self._records and model in self._unrouted:
            return self._unrouted[model]
        record = self._records.get(model)
        if version is None and record is not None and record.unloaded:
            return UNLOADED  # settled on purpose: the gateway is ready without it
        if version is not None:
            return self._notes.get((model, version)) or self._backend.problem(model, version)
        noted = [f"version {v}: {reason}" for (m, v), reason in sorted(self._notes.items()) if m == model]
        backend = self._backend.problem(model)
        return "; ".join([*noted, backend] if backend else noted) or None

    def failures(self, model: str) -> dict[int, str]:
        """The versions on disk that failed to load or warm up (at startup, in an action) and do not serve, with why:
        a model whose stable version serves still has them as a problem. A version removed from disk since is none."""
        entry = self._catalog.entries.get(model)
        on_disk = set(entry.available) if entry is not None else set()
        failed = {v: reason for (m, v), reason in self._notes.items() if m == model}
        states = self._backend.models().get(model, {})
        for version, state in states.items():
            if state is VersionState.UNAVAILABLE and version not in failed:
                failed[version] = self._backend.problem(model, version) or "unavailable"
        for version in on_disk - states.keys() - failed.keys():  # dropped by its backend, which kept why (Triton)
            reason = self._backend.problem(model, version)
            if reason is not None:
                failed[version] = reason
        return {v: failed[v] for v in sorted(failed) if v in on_disk}

    def ready(self, model: str) -> bool:
        """The model's stable version serves unversioned requests now."""
        record = self._records.get(model)
        if record is None or record.unloaded:
            return False
        state = self._backend.state(model, record.stable)
        if state is VersionState.READY:
            return True
        return self.on_demand and (state is None or (model, record.stable) in self._evicting)
