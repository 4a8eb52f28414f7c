"""The Triton backend's health probe: Triton's repository index read every ``triton_probe_interval_s`` is the
liveness signal, the version states the router reads, and the cue to load wanted versions again after Triton
restarted (explicit mode serves nothing after a restart)."""

from __future__ import annotations

import asyncio
import logging
import time

from services.gateway.backends.circuit import CircuitBreaker, CircuitState
from services.gateway.errors import BackendUnavailable, GatewayError
from services.gateway.settings import Settings
from services.gateway.tensors.types import VersionState
from services.modelrepo.control import ModelControl, ModelControlError, RepositoryIndex

log = logging.getLogger(__name__)


class TritonHealth:
    """Part of ``TritonBackend``: what it shares with the probe is declared here."""

    _settings: Settings
    _control: ModelControl | None
    _breaker: CircuitBreaker
    _live: bool
    _wanted: dict[str, set[int]]
    _states: dict[str, dict[int, VersionState]]
    _locks: dict[str, asyncio.Lock]
    _last_reload: dict[str, float]

    async def _apply(self, model: str, versions: set[int]) -> None:
        raise NotImplementedError

    def _record_failures(self, model: str, versions: set[int], error: GatewayError) -> None:
        raise NotImplementedError

    def _update_states(self, index: RepositoryIndex) -> None:
        raise NotImplementedError

    def _renew_channels(self) -> None:
        raise NotImplementedError

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.triton_probe_interval_s)
            try:
                self._renew_channels()  # before the probe's call: a certificate Triton refused is replaced first
                await self._sync(force_reload=False)
            except Exception:  # the probe must outlive any surprise; the next tick tries again
                log.exception("Triton health probe failed")

    async def _sync(self, *, force_reload: bool) -> None:
        """One probe: read Triton's repository index (its answer is the liveness signal), update the version
        states, and load wanted versions Triton lost (a restarted Triton in explicit mode serves nothing)."""
        assert self._control is not None, "start() first"
        try:
            index = await self._control.index(self._settings.triton_control_timeout_s)
        except ModelControlError:
            if self._live:
                log.warning("Triton at %s stopped answering; failing requests fast", self._settings.triton_url)
            self._live = False
            self._breaker.trip()
            return
        if not self._live:
            log.info("Triton at %s answers", self._settings.triton_url)
            force_reload = True
        self._live = True
        if self._breaker.state is not CircuitState.CLOSED:
            self._breaker.reset()
        self._update_states(index)
        now = time.monotonic()
        for model, wanted in self._wanted.items():
            lock = self._locks[model]
            if not wanted or lock.locked():
                continue
            states = index.get(model, {})
            lost = any(states.get(v) not in ("READY", "LOADING") for v in wanted)
            recently = now - self._last_reload.get(model, -1e9) < self._settings.triton_reload_interval_s
            if lost and (force_reload or not recently):
                for version in wanted:
                    if self._states[model].get(version) is not VersionState.READY:
                        self._states[model][version] = VersionState.LOADING
                async with lock:
                    await self._reload(model)

    async def _reload(self, model: str) -> None:
        """Load the wanted versions again; versions Triton refuses leave the wanted set with their reason, so
        the probe does not hammer Triton with a load that cannot succeed (a model it has no backend for)."""
        wanted = set(self._wanted[model])
        try:
            await self._apply(model, wanted)
            return
        except BackendUnavailable as exc:
            log.warning("%s", exc)  # Triton went away again: the next probe retries
            return
        except GatewayError:
            pass
        # Triton fails a whole model whose cold load has one bad version (a loaded model keeps serving when a
        # version added to it fails): find the bad ones by loading the versions one at a time.
        good: set[int] = set()
        for version in sorted(wanted):
            try:
                await self._apply(model, good | {version})
                good.add(version)
            except BackendUnavailable as exc:
                log.warning("%s", exc)
                return
            except GatewayError as exc:  # one broken version must not keep the others from serving
                self._record_failures(model, {version}, exc)
                log.error("model '%s' version %d unavailable: %s", model, version, exc)
        self._wanted[model] = good
