"""Tuning trials on Triton: a trial config loads into the same Triton under a private model name, with a complete
config override and the version's model file sent along (Triton's load with override files), so the serving model
and its config are untouched. In place (``--in-place``) the override goes to the serving model itself and the
serving config is loaded back afterwards: tried ``RESTORE_ATTEMPTS`` times, and when it still fails the unload raises
``ServingConfigNotRestored`` with Triton's reason and what Triton serves the model with now, so that the run ends
saying so instead of leaving production on a trial's config unannounced.

Trials have their own channels, circuit breaker and no metrics: a failing trial never opens the serving breaker,
and no metric label names a trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from services.gateway.backends.circuit import CircuitBreaker
from services.gateway.backends.triton.calls import TritonCalls
from services.gateway.backends.triton.channels import TritonChannels, open_channels
from services.gateway.backends.triton.configs import ConfigTransform
from services.gateway.backends.triton.errors import TritonErrors
from services.gateway.errors import GatewayError
from services.gateway.repository import ModelEntry
from services.gateway.settings import Settings
from services.gateway.tensors.types import InferInput, InferRequest
from services.modelrepo import layout
from services.modelrepo.config import override_json
from services.modelrepo.control import ModelControl, ModelControlError

log = logging.getLogger(__name__)

Serving = Callable[[str], tuple[mc.ModelConfig, set[int]]]
"""model -> the config the serving backend loads it with, and the versions it keeps loaded."""

RESTORE_ATTEMPTS = 3
RESTORE_PAUSES_S = (1.0, 2.0)
"""The pauses before the second and third attempt to load the serving config back: a Triton that was busy, or
restarting, gets a moment; a refusal that stands is reported a few seconds later."""


@dataclass(frozen=True)
class NotRestored:
    """An in-place trial after which the serving config could not be loaded back, and what Triton serves now."""

    model: str
    reason: str
    """The last attempt's error, in Triton's words."""
    attempts: int
    trial: mc.ModelConfig
    """The trial's config, as sent to Triton."""
    serving: mc.ModelConfig
    """The serving config, as the attempts sent it."""
    ready: tuple[int, ...] | None = None
    """The versions Triton reports READY now; ``None`` when its index could not be read."""
    config: mc.ModelConfig | None = None
    """The config Triton serves the model with now, as Triton reports it (completed with its defaults); ``None`` when
    it could not be read (or no version is ready)."""
    unread: str | None = None
    """Why ``ready`` or ``config`` could not be read."""


class ServingConfigNotRestored(GatewayError):
    """An in-place trial's unload could not load the serving config back (``failure`` says what Triton serves)."""

    def __init__(self, failure: NotRestored) -> None:
        super().__init__(
            f"the serving config of model '{failure.model}' could not be loaded back into Triton after an in-place "
            f"trial ({failure.attempts} attempts): {failure.reason}",
            503,
        )
        self.failure = failure


class TritonTrials:
    def __init__(self, settings: Settings, transform: ConfigTransform, serving: Serving) -> None:
        self._settings = settings
        self._transform = transform
        self._serving = serving
        breaker = CircuitBreaker(settings.triton_breaker_failures, settings.triton_breaker_reset_s)
        self._errors = TritonErrors(breaker, settings.triton_url)
        self._calls = TritonCalls(breaker, self._errors, settings, None)
        self._channels: TritonChannels | None = None
        self._loaded: set[str] = set()
        self._in_place: dict[str, mc.ModelConfig] = {}
        """In-place trials loaded: model -> the trial config sent."""
        self.not_restored: NotRestored | None = None
        """The last in-place trial whose serving config could not be loaded back (``None``: none so far)."""

    def _control(self) -> ModelControl:
        if self._channels is None:
            self._channels = self._calls.channels = open_channels(self._settings)
        return ModelControl(self._channels.client)

    async def load(self, name: str, config: mc.ModelConfig, entry: ModelEntry, version: int) -> None:
        control = self._control()
        assert self._channels is not None
        in_place = name == entry.name
        twin = self._transform(config)
        if in_place:
            versions, files = self._serving(name)[1] | {version}, None
            self._in_place[name] = twin
        else:
            versions, files = {version}, _files(entry, version, twin)
        self._loaded.add(name)
        timeout = self._settings.triton_load_timeout_s
        client = self._channels.client
        try:
            await client.load_model(name, config=override_json(twin, versions), files=files, client_timeout=timeout)
            if in_place:
                await control.settle(name, versions, deadline=time.monotonic() + timeout)
            # A model loaded from override files is in no repository folder, hence not in the repository index;
            # Triton answers the load once the model is loaded or failed: ask whether it is ready.
            elif not await client.is_model_ready(name, str(version), client_timeout=timeout):
                raise GatewayError(f"Triton did not load the trial config '{name}' (see Triton's log)", 503)
        except InferenceServerException as exc:
            raise GatewayError(f"Triton did not load the trial config '{name}': {exc.message() or exc}", 503) from None
        except grpc.RpcError as exc:
            raise GatewayError(f"Triton did not load the trial config '{name}': {exc}", 503) from None
        except ModelControlError as exc:
            raise self._errors.control_error(exc) from None

    async def infer(self, name: str, version: int, inputs: list[InferInput]) -> None:
        request = InferRequest(model=name, version=version, inputs=inputs)
        await self._calls.infer(request, version=version, timeout_s=None, priority=0)

    async def unload(self, name: str) -> None:
        """Unload a trial; an in-place one: load the serving config back, and raise ``ServingConfigNotRestored`` when
        that still fails after ``RESTORE_ATTEMPTS`` tries (a trial beside the model only logs a failed unload: the
        serving model is untouched by it)."""
        if name not in self._loaded:
            return
        self._loaded.discard(name)
        control, timeout = self._control(), self._settings.triton_load_timeout_s
        trial = self._in_place.pop(name, None)
        if trial is not None:
            await self._restore(name, trial, control, timeout)
            return
        try:
            await control.unload(name, timeout_s=timeout)
        except ModelControlError as exc:
            log.error("tuning: unloading trial '%s' from Triton failed: %s", name, exc)

    async def _restore(self, name: str, trial: mc.ModelConfig, control: ModelControl, timeout: float) -> None:
        config, versions = self._serving(name)
        reason = ""
        for attempt in range(1, RESTORE_ATTEMPTS + 1):
            try:
                await control.load(name, config, versions, timeout_s=timeout)
            except ModelControlError as exc:
                reason = str(exc)
                log.warning("tuning: loading the serving config of '%s' back into Triton failed (attempt %d of %d): %s",
                            name, attempt, RESTORE_ATTEMPTS, reason)
            else:
                if attempt > 1:
                    log.warning("tuning: the serving config of '%s' is loaded back (attempt %d)", name, attempt)
                return
            if attempt < RESTORE_ATTEMPTS:
                await asyncio.sleep(RESTORE_PAUSES_S[attempt - 1])
        failure = await self._served_now(NotRestored(name, reason, RESTORE_ATTEMPTS, trial, config), control)
        self.not_restored = failure
        error = ServingConfigNotRestored(failure)
        log.error("tuning: %s; Triton reports version(s) %s of it READY", error, list(failure.ready or ()))
        raise error

    async def _served_now(self, failure: NotRestored, control: ModelControl) -> NotRestored:
        """``failure`` with what Triton serves the model with now, as far as it says."""
        assert self._channels is not None
        name, timeout = failure.model, self._settings.triton_control_timeout_s
        try:
            index = await control.index(timeout)
        except ModelControlError as exc:
            return replace(failure, unread=f"Triton's index: {exc}")
        ready = tuple(sorted(v for v, state in index.get(name, {}).items() if state == "READY"))
        if not ready:  # no config to read; the backend's health probe loads the serving config when it sees this
            return replace(failure, ready=ready)
        try:
            answer = await self._channels.client.get_model_config(name, client_timeout=timeout)
        except InferenceServerException as exc:
            return replace(failure, ready=ready, unread=f"its config: {exc.message() or exc}")
        except grpc.RpcError as exc:
            return replace(failure, ready=ready, unread=f"its config: {exc}")
        return replace(failure, ready=ready, config=answer.config)

    async def close(self) -> None:
        for name in sorted(self._loaded):
            with contextlib.suppress(ServingConfigNotRestored):  # kept as ``not_restored``; unload the others still
                await self.unload(name)
        if self._channels is not None:
            await self._channels.close()
            self._channels = self._calls.channels = None

    def server_pids(self) -> list[int]:
        return [os.getpid(), *_local_triton_pids(self._settings.triton_url)]


def _files(entry: ModelEntry, version: int, twin: mc.ModelConfig) -> dict[str, bytes]:
    """The override files Triton builds the trial's model folder from: the model file (or folder), the warm-up
    data, and the local CPU Triton's generic ``model.py`` when the config loads as its python-backend twin."""
    filename = layout.model_filename(entry.config)
    if filename is None:
        raise GatewayError(f"model '{entry.name}' has no model file to send to Triton with a trial config", 422)
    source = entry.version_dir(version) / filename
    paths = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    files = {f"file:{version}/{p.relative_to(entry.version_dir(version)).as_posix()}": p.read_bytes() for p in paths}
    warmup = entry.path / layout.WARMUP_DIR  # the config's model_warmup reads its data from there
    if warmup.is_dir():
        files |= {f"file:{layout.WARMUP_DIR}/{p.name}": p.read_bytes() for p in sorted(warmup.iterdir()) if p.is_file()}
    twinned = layout.platform(entry.config) in (layout.ONNX_PLATFORM, layout.TORCHSCRIPT_PLATFORM)
    if twin.backend == "python" and twinned:
        # Only a gateway started with --triton-local-cpu twins configs; that one has imported tritonlocal already.
        source_text = resources.files("services.tritonlocal").joinpath("python_model.py").read_bytes()
        files[f"file:{version}/{layout.model_filename(twin)}"] = source_text
    return files


def _local_triton_pids(url: str) -> list[int]:
    """tritonserver's process group (its python-backend stubs run in it) when it serves ``url`` on this host."""
    parts = urlsplit(f"//{url}")
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
        return []
    wanted = f"--grpc-port={parts.port}".encode()
    groups = set()
    for pid in _pids():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command and command[0].endswith(b"tritonserver") and wanted in command:
            groups.add(os.getpgid(pid))
    return [pid for pid in _pids() if _group(pid) in groups] if groups else []


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
