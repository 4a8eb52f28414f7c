"""``TritonBackend``: the ``Backend`` protocol against a Triton server in ``--model-control-mode=explicit``.

The backend loads what the version manager tells it, keeps that as the wanted state, and (``health``) loads it
again by itself when Triton comes back after a crash. A version Triton refuses to load is not retried until
someone asks for it again: its reason is reported instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping

from tritonclient.grpc import model_config_pb2, service_pb2

from services.gateway import repository
from services.gateway.backends.base import describe_problem
from services.gateway.backends.circuit import CircuitBreaker
from services.gateway.backends.triton.calls import TritonCalls
from services.gateway.backends.triton.channels import TlsWatch, TritonChannels, open_channels, retire
from services.gateway.backends.triton.configs import ConfigTransform, identity, warn_if_single_instance
from services.gateway.backends.triton.errors import TritonErrors
from services.gateway.backends.triton.health import TritonHealth
from services.gateway.backends.triton.http_pool import HttpPool
from services.gateway.backends.triton.shared_memory import TritonSharedMemory
from services.gateway.backends.triton.statistics import read_statistics
from services.gateway.backends.triton.trials import TritonTrials
from services.gateway.errors import BackendUnavailable, GatewayError, unknown_version
from services.gateway.metrics import GatewayMetrics
from services.gateway.security import CertificatesInUse, TlsError
from services.gateway.settings import Settings
from services.gateway.tensors.types import InferRequest, InferResponse, ModelMetadata, VersionState
from services.modelrepo.config import pinned
from services.modelrepo.control import ModelControl, ModelControlError, RepositoryIndex

log = logging.getLogger(__name__)

_STATES = {"READY": VersionState.READY, "LOADING": VersionState.LOADING}


class TritonBackend(TritonHealth):
    """``repository_path`` is the repository Triton serves; configs come from it because Triton cannot describe
    a model before it is loaded. ``transform`` maps each config to what this Triton should load (the local CPU
    Triton's python-backend twins; identity for a production Triton)."""

    def __init__(
        self,
        catalog: repository.Catalog,
        settings: Settings,
        *,
        transform: ConfigTransform = identity,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self._catalog = catalog
        self._settings = settings
        self._transform = transform
        self._metrics = metrics
        self._breaker = CircuitBreaker(settings.triton_breaker_failures, settings.triton_breaker_reset_s)
        self._errors = TritonErrors(self._breaker, settings.triton_url)
        self._channels: TritonChannels | None = None
        self._control: ModelControl | None = None
        self._tls_watch = TlsWatch(settings)
        self._certificates = CertificatesInUse(metrics.tls_certificate_expiry if metrics is not None else None)
        """The dates of the TLS files the channels to Triton use (warned of at the start by ``check_tls_files``)."""
        self._retiring: set[asyncio.Task[None]] = set()
        """Channels replaced by new ones (new TLS files), closing once their calls are over."""
        self._probe: asyncio.Task[None] | None = None
        self.config_sent: list[Callable[[str], None]] = []
        """Called with a model's name once Triton serves what this backend last sent it (its own config, or nothing):
        what was said of a config Triton held instead (a tuning trial's it did not take back) no longer holds."""
        self._live = False
        self._calls = TritonCalls(self._breaker, self._errors, settings, metrics)
        self.shared_memory: TritonSharedMemory | None = None
        """Registers the clients' shared-memory regions in Triton too, when it shares the host's /dev/shm."""
        if settings.triton_shared_memory:
            self.shared_memory = TritonSharedMemory(settings, lambda: self._channels and self._channels.client)
        self._configs: dict[str, model_config_pb2.ModelConfig] = {}
        self._metadata: dict[tuple[str, int], ModelMetadata] = {}
        self._wanted: dict[str, set[int]] = {}
        self._states: dict[str, dict[int, VersionState]] = {}
        self._failures: dict[str, dict[int, str]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_reload: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------
    shared_server = True
    enforces_deadlines = True  # every call carries its deadline as the gRPC deadline (calls.py)
    runs_model_warmup = True
    forwards_parameters = True  # both transports put them in Triton's request (codec.py, http_codec.py)

    async def adopt(self, model: str, versions: Collection[int]) -> None:
        """Another gateway drove this model's versions on the shared Triton: want ``versions`` from now on, so that
        this one's self-heal and its next load (a complete override) keep what the others keep, and nothing more."""
        entry = self._catalog.entry(model)
        self._track(model)
        self._configs.setdefault(model, self._transform(entry.config))
        self._wanted[model] = set(versions)
        if self._control is not None:
            try:
                self._update_states(await self._control.index(self._settings.triton_control_timeout_s))
            except ModelControlError as exc:
                raise self._errors.control_error(exc) from None

    async def start(self, initial: Mapping[str, Collection[int]]) -> None:
        for name, versions in initial.items():
            entry = self._catalog.entry(name)
            if _model_problem(entry) is not None:
                continue
            self._track(name)
            warn_if_single_instance(entry.config)
            self._configs[name] = self._transform(entry.config)
            self._wanted[name] = set(versions)
            self._states[name] = dict.fromkeys(versions, VersionState.UNAVAILABLE)  # until Triton says more
        self._channels = open_channels(self._settings)
        self._certificates.use(self._channels.certificates, announce=False)
        self._control = ModelControl(self._channels.client)
        self._calls.channels = self._channels
        if self._settings.triton_http_url:
            host, _, port = self._settings.triton_http_url.rpartition(":")
            self._calls.http = HttpPool(host, int(port))
        await self._sync(force_reload=True)
        if not self._live:
            log.warning("Triton at %s is not reachable; its models load once it answers", self._settings.triton_url)
        self._probe = asyncio.create_task(self._probe_loop(), name="triton-health-probe")

    def _renew_channels(self) -> None:
        """New channels to Triton once its TLS files changed (the health probe asks before each probe): new calls go
        over them at once, calls in flight finish on the old ones. Files that do not load (half-written, a key that
        does not match, a client certificate outside its validity dates) are logged once and the channels stay as
        they are. A certificate in use that crosses into its last days or past its end is logged here too."""
        self._certificates.tick()
        if not self._tls_watch.changed():
            return
        try:
            fresh = open_channels(self._settings, renewal=True)
        except TlsError as exc:
            note = self._tls_watch.refused(exc)
            log.error("TLS to Triton not reloaded, the connections keep the previous files: %s%s", exc, note)
            return
        old, self._channels, self._calls.channels = self._channels, fresh, fresh
        self._control = ModelControl(fresh.client)
        log.info("TLS to Triton reloaded from %s: new calls connect with it", self._tls_watch.cert_path)
        self._certificates.use(fresh.certificates)
        if old is not None:
            settings = self._settings
            calls_s = max(settings.max_timeout_ms / 1000, settings.triton_infer_timeout_s)
            task = asyncio.create_task(retire(old, calls_s=calls_s, control_s=settings.triton_load_timeout_s))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def _track(self, model: str) -> None:
        """Start keeping state for a model (at startup, or one found in the repository later)."""
        if model not in self._locks:
            self._states[model], self._failures[model], self._locks[model] = {}, {}, asyncio.Lock()
            self._wanted[model] = set()

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        for retiring in list(self._retiring):
            retiring.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._channels is not None:
            await self._channels.close()
            self._channels = self._control = self._calls.channels = None
        if self._calls.http is not None:
            self._calls.http.close()
            self._calls.http = None
        self._live = False

    async def live(self) -> bool:
        return self._live

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        states = self._states
        return {name: states.get(name, {}) for name in self._catalog.entries}

    def state(self, model: str, version: int) -> VersionState | None:
        versions = self._states.get(model)
        return None if versions is None else versions.get(version)

    def problem(self, model: str, version: int | None = None) -> str | None:
        entry = self._catalog.entries.get(model)
        if entry is None:
            return None
        serving = VersionState.READY in self._states.get(model, {}).values()
        return describe_problem(_model_problem(entry), self._failures.get(model, {}), serving, version)

    # -- model control (gRPC only: a load over HTTP stalls Triton's HTTP inference) -----------------------
    async def load(self, model: str, version: int) -> None:
        # Re-read from disk: versions exported after startup and a re-exported config count. Triton takes the
        # config per model, so the versions already loaded get it too (Triton swaps their instances gracefully).
        entry = await asyncio.to_thread(self._catalog.refresh, model, version)
        problem = _model_problem(entry)
        if problem is not None:
            raise GatewayError(f"model '{model}' is unavailable: {problem}", 503)
        self._track(model)
        async with self._locks[model]:
            previous_config = self._configs.get(model)
            self._configs[model] = self._transform(entry.config)
            self._metadata = {key: value for key, value in self._metadata.items() if key[0] != model}
            try:
                await self._switch(model, self._wanted[model] | {version})
            except GatewayError:
                if previous_config is not None:
                    self._configs[model] = previous_config
                raise

    async def unload(self, model: str, version: int) -> None:
        self._catalog.entry(model)
        if version not in self._states.get(model, {}):
            raise unknown_version(model, version, "not loaded")
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
                await self._observe_settled()
            raise

    async def _observe_settled(self) -> None:
        """Read Triton's index once more after a failed load: the probe may have seen the failed versions LOADING
        while the load ran, and that view would stand until its next tick, a version shown loading after its
        action failed."""
        assert self._control is not None, "start() first"
        with contextlib.suppress(ModelControlError):  # Triton stopped answering: the probe notices and says so
            self._update_states(await self._control.index(self._settings.triton_control_timeout_s))

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
        for listener in self.config_sent:
            listener(model)

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
            config = self._catalog.entry(model).config
            found = self._metadata[key] = repository.metadata_from_config(config, (version,))
        return found

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        self._check_known(model, version)
        return pinned(self._configs[model], self._wanted[model])

    def trials(self) -> TritonTrials:
        """A host for tuning trials in the same Triton, on its own connections (``services.gateway.tuning``)."""
        return TritonTrials(self._settings, self._transform, self._serving)

    def _serving(self, model: str) -> tuple[model_config_pb2.ModelConfig, set[int]]:
        return self._configs[model], set(self._wanted.get(model, ()))

    def _check_known(self, model: str, version: int) -> None:
        self._catalog.entry(model)
        if version not in self._states.get(model, {}):
            raise unknown_version(model, version, "not loaded")

    # -- inference (calls.py; decoupled models: streams.py) ---------------------------------------------------------
    def trace(self) -> None:
        """Tracing is on: each call to Triton is a client span, and Triton gets its context (``traceparent``)."""
        self._calls.traced = True

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        if self.shared_memory is None:
            return await self._calls.infer(request, version=version, timeout_s=timeout_s, priority=priority)
        call = functools.partial(self._calls.infer, version=version, timeout_s=timeout_s, priority=priority)
        return await self.shared_memory.infer(call, request)

    def decoupled(self, model: str) -> bool:
        config = self._configs.get(model)
        return config is not None and config.model_transaction_policy.decoupled

    def infer_stream(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> AsyncIterator[InferResponse]:
        return self._calls.stream(request, version=version, timeout_s=timeout_s, priority=priority)

    async def statistics(self, model: str | None, version: int | None) -> list[service_pb2.ModelStatistics]:
        """Triton's own figures, as Triton counts them (warm-up and shadow requests included)."""
        if self._channels is None:
            raise self._errors.unavailable(f"Triton at {self._settings.triton_url} is not connected", public=True)
        timeout = self._settings.triton_control_timeout_s
        found = await read_statistics(self._channels.client, self._errors, model, version, timeout)
        known = self._catalog.entries  # a shared Triton may serve models this gateway's repository does not have
        return [stats for stats in found if stats.name in known]

    def _update_states(self, index: RepositoryIndex) -> None:
        for model, wanted in self._wanted.items():
            states = index.get(model, {})
            view = {v: _STATES.get(state, VersionState.UNAVAILABLE) for v, state in states.items() if state in _STATES}
            for v in wanted:
                view.setdefault(v, VersionState.UNAVAILABLE)
            self._states[model] = view


def _model_problem(entry: repository.ModelEntry) -> str | None:
    if entry.problem is not None:
        return entry.problem
    return None if entry.available else f"no version folder under {entry.path}"
