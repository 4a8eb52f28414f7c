"""``TritonBackend``: the ``Backend`` protocol against a Triton server in ``--model-control-mode=explicit``.

The backend loads what each model's ``version_policy`` selects, keeps that as the wanted state, and loads it
again by itself when Triton comes back after a crash. A version Triton refuses to load is not retried until
someone asks for it again: its reason is reported instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import grpc
from tritonclient.grpc import model_config_pb2

from services.gateway import repository
from services.gateway.backends.circuit import CircuitBreaker, CircuitState
from services.gateway.backends.triton.channels import TritonChannels, open_channels
from services.gateway.backends.triton.codec import infer_request, infer_response
from services.gateway.backends.triton.configs import ConfigTransform, identity, warn_if_single_instance
from services.gateway.backends.triton.errors import TritonErrors
from services.gateway.errors import BackendUnavailable, DeadlineExceeded, GatewayError, ModelNotFound, Overloaded
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from services.gateway.types import InferRequest, InferResponse, ModelMetadata, VersionState
from services.modelrepo.config import pinned
from services.modelrepo.control import ModelControl, ModelControlError, RepositoryIndex

log = logging.getLogger(__name__)

_STATES = {"READY": VersionState.READY, "LOADING": VersionState.LOADING}


class TritonBackend:
    """``repository_path`` is the repository Triton serves; configs come from it because Triton cannot describe
    a model before it is loaded. ``transform`` maps each config to what this Triton should load (the local CPU
    Triton's python-backend twins; identity for a production Triton)."""

    def __init__(
        self,
        repository_path: Path,
        settings: Settings,
        *,
        transform: ConfigTransform = identity,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self._root = repository_path
        self._settings = settings
        self._transform = transform
        self._metrics = metrics
        self._breaker = CircuitBreaker(settings.triton_breaker_failures, settings.triton_breaker_reset_s)
        self._errors = TritonErrors(self._breaker, settings.triton_url)
        self._channels: TritonChannels | None = None
        self._control: ModelControl | None = None
        self._probe: asyncio.Task[None] | None = None
        self._live = False
        self._inflight = 0
        self._entries: dict[str, repository.ModelEntry] = {}
        self._configs: dict[str, model_config_pb2.ModelConfig] = {}
        self._metadata: dict[tuple[str, int], ModelMetadata] = {}
        self._wanted: dict[str, set[int]] = {}
        self._states: dict[str, dict[int, VersionState]] = {}
        self._problems: dict[str, str] = {}
        self._failures: dict[str, dict[int, str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_reload: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._entries = await asyncio.to_thread(repository.scan, self._root)
        for name, entry in self._entries.items():
            self._states[name], self._failures[name], self._locks[name] = {}, {}, asyncio.Lock()
            self._wanted[name] = set()
            problem = entry.problem or (None if entry.available else f"no version folder under {entry.path}")
            if problem is not None:
                self._problems[name] = problem
                log.error("model '%s' is unavailable: %s", name, problem)
                continue
            warn_if_single_instance(entry.config)
            self._configs[name] = self._transform(entry.config)
            self._wanted[name] = set(entry.selected)
            self._states[name] = dict.fromkeys(entry.selected, VersionState.UNAVAILABLE)  # until Triton says more
        self._channels = open_channels(self._settings)
        self._control = ModelControl(self._channels.client)
        await self._sync(force_reload=True)
        if not self._live:
            log.warning("Triton at %s is not reachable; its models load once it answers", self._settings.triton_url)
        self._probe = asyncio.create_task(self._probe_loop(), name="triton-health-probe")

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        if self._channels is not None:
            await self._channels.close()
            self._channels = self._control = None
        self._live = False

    async def live(self) -> bool:
        return self._live

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        return self._states

    def problem(self, model: str, version: int | None = None) -> str | None:
        if model in self._problems:
            return self._problems[model]
        failures = self._failures.get(model, {})
        if version is not None:
            return failures.get(version)
        if failures and VersionState.READY not in self._states.get(model, {}).values():
            return "; ".join(f"version {v}: {reason}" for v, reason in sorted(failures.items()))
        return None

    # -- model control (gRPC only: a load over HTTP stalls Triton's HTTP inference) -----------------------
    async def load(self, model: str, version: int) -> None:
        # Re-read from disk: versions exported after startup count.
        await asyncio.to_thread(repository.refresh, self._entries, model, version)
        if model in self._problems:
            raise GatewayError(f"model '{model}' is unavailable: {self._problems[model]}", 503)
        async with self._locks[model]:
            await self._switch(model, self._wanted[model] | {version})

    async def unload(self, model: str, version: int) -> None:
        repository.find(self._entries, model)
        if version not in self._states.get(model, {}):
            raise ModelNotFound(f"model '{model}' version {version} is not loaded")
        async with self._locks[model]:
            # Triton lets the requests in flight on a dropped version finish before unloading it.
            await self._switch(model, self._wanted[model] - {version})

    async def _switch(self, model: str, wanted: set[int]) -> None:
        previous, self._wanted[model] = self._wanted[model], wanted
        try:
            await self._apply(model, wanted)
        except GatewayError as exc:
            self._wanted[model] = previous  # what Triton could not do is not wanted: the probe must not retry it
            if not isinstance(exc, BackendUnavailable):
                self._record_failures(model, wanted - previous, exc)
            raise

    async def _apply(self, model: str, versions: set[int]) -> None:
        """Make Triton serve exactly ``versions`` of ``model`` and return once they have settled."""
        assert self._control is not None, "start() first"
        timeout = self._settings.triton_load_timeout_s
        try:
            if versions:
                await self._control.load(
                    model, self._configs[model], versions, timeout_s=timeout, observe=self._update_states
                )
            else:
                await self._control.unload(model, timeout_s=timeout, observe=self._update_states)
        except ModelControlError as exc:
            raise self._errors.control_error(exc) from None
        finally:
            self._last_reload[model] = time.monotonic()
        for version in versions:
            self._failures[model].pop(version, None)

    def _record_failures(self, model: str, versions: set[int], error: GatewayError) -> None:
        states = self._states.get(model, {})
        for version in versions:
            if states.get(version) is not VersionState.READY:
                self._failures[model][version] = str(error)

    # -- queries (no I/O: the probe keeps the view current) ------------------------------------------------
    async def ready(self, model: str, version: int) -> bool:
        return self._live and self._states.get(model, {}).get(version) is VersionState.READY

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        key = (model, version)
        found = self._metadata.get(key)
        if found is None:
            self._check_known(model, version)
            # The repository's config, not the one Triton loads: a local python-backend twin is still an ONNX model.
            config = self._entries[model].config
            found = self._metadata[key] = repository.metadata_from_config(config, (version,))
        return found

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        self._check_known(model, version)
        return pinned(self._configs[model], self._wanted[model])

    def _check_known(self, model: str, version: int) -> None:
        repository.find(self._entries, model)
        if version not in self._states.get(model, {}):
            raise ModelNotFound(f"model '{model}' has no version {version} loaded")

    # -- inference ------------------------------------------------------------------------------------------
    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        if timeout_s is not None and timeout_s <= 0:
            raise DeadlineExceeded(f"request to model '{request.model}' has no time left for Triton")
        breaker, channels = self._breaker, self._channels
        if channels is None or not breaker.allow():
            raise self._errors.unavailable(f"Triton at {self._settings.triton_url} is unavailable (circuit open)")
        if self._inflight >= self._settings.triton_max_inflight:
            breaker.release()
            raise Overloaded(f"{self._inflight} requests are already in flight to Triton")
        message = infer_request(request, version, timeout_s, priority)
        self._inflight += 1
        started = time.monotonic()
        try:
            if timeout_s is not None:
                # The client timeout ends the call on our side when Triton's own queue timeout does.
                reply = await channels.infer(message, timeout=timeout_s)
            else:
                # No deadline: only a safety net against a Triton that accepts calls and never answers. A gRPC
                # deadline would cost a timer in gRPC core here and in Triton on every call; the loop's is cheap.
                async with asyncio.timeout(self._settings.triton_infer_timeout_s):
                    reply = await channels.infer(message)
        except TimeoutError:
            breaker.record_failure()  # a Triton that sits on a call this long is not healthy
            limit = self._settings.triton_infer_timeout_s
            raise DeadlineExceeded(f"Triton did not answer model '{request.model}' within {limit:g} s") from None
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            raise self._errors.infer_error(code, str(details or ""), request.model, version, timeout_s) from None
        except OSError as exc:
            breaker.record_failure()
            raise self._errors.unavailable(f"Triton at {self._settings.triton_url} is unreachable: {exc}") from None
        finally:
            self._inflight -= 1
        breaker.record_success()
        if self._metrics is not None:
            self._metrics.backend_time(request.model, str(version)).observe(time.monotonic() - started)
        return infer_response(reply, request, version)

    # -- health probe and reconciliation ---------------------------------------------------------------------
    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.triton_probe_interval_s)
            try:
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
        except BackendUnavailable as exc:
            log.warning("%s", exc)  # Triton went away again: the next probe retries
        except GatewayError as exc:  # one broken model must not keep the others from serving
            self._record_failures(model, wanted, exc)
            failed = set(self._failures[model]) & wanted
            self._wanted[model] = wanted - failed
            log.error("model '%s' version(s) %s unavailable: %s", model, sorted(failed), exc)

    def _update_states(self, index: RepositoryIndex) -> None:
        for model, wanted in self._wanted.items():
            states = index.get(model, {})
            view = {v: _STATES.get(state, VersionState.UNAVAILABLE) for v, state in states.items() if state in _STATES}
            for v in wanted:
                view.setdefault(v, VersionState.UNAVAILABLE)
            self._states[model] = view
