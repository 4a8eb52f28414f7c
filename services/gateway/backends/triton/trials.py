"""Tuning trials on Triton: a trial config loads into the same Triton under a private model name, with a complete
config override and the version's model file sent along (Triton's load with override files), so the serving model
and its config are untouched. In place (``--in-place``) the override goes to the serving model itself and the
serving config is loaded back afterwards.

Trials have their own channels, circuit breaker and no metrics: a failing trial never opens the serving breaker,
and no metric label names a trial.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
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
        self._in_place: set[str] = set()

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
            self._in_place.add(name)
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
        if name not in self._loaded:
            return
        self._loaded.discard(name)
        control, timeout = self._control(), self._settings.triton_load_timeout_s
        try:
            if name in self._in_place:
                self._in_place.discard(name)
                config, versions = self._serving(name)
                await control.load(name, config, versions, timeout_s=timeout)
            else:
                await control.unload(name, timeout_s=timeout)
        except ModelControlError as exc:
            log.error("tuning: unloading trial '%s' from Triton failed: %s", name, exc)

    async def close(self) -> None:
        for name in sorted(self._loaded):
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
