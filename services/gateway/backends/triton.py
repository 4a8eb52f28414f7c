"""The Triton backend: model versions served by a Triton server, reached over gRPC (``tritonclient.grpc.aio``).

This module is the one boundary where Triton's and gRPC's errors become gateway errors. Triton runs in
``--model-control-mode=explicit``: the backend loads what each model's ``version_policy`` selects, keeps
that as the wanted state, and loads it again by itself when Triton comes back after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as triton
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from services.gateway import repository
from services.gateway.backends.circuit import CircuitBreaker, CircuitState
from services.gateway.datatypes import numpy_dtype
from services.gateway.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    GatewayError,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from services.gateway.types import InferOutput, InferRequest, InferResponse, ModelMetadata, VersionState

log = logging.getLogger(__name__)

ConfigTransform = Callable[[model_config_pb2.ModelConfig], model_config_pb2.ModelConfig]
_STATES = {"READY": VersionState.READY, "LOADING": VersionState.LOADING}
_SETTLE_POLL_S = 0.05


def identity(config: model_config_pb2.ModelConfig) -> model_config_pb2.ModelConfig:
    return config


class TritonBackend:
    """Implements the ``Backend`` protocol against a Triton server in explicit model-control mode.

    ``repository_path`` is the exporter's repository, the one Triton serves; configs come from it because
    Triton cannot describe a model before it is loaded. ``transform`` maps each config to what this Triton
    should load (``derive_config`` for the local CPU Triton's python-backend twins; identity otherwise).
    """

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
        self._client: Any = None
        self._channel: grpc.aio.Channel | None = None
        self._infer_call: Any = None
        self._probe: asyncio.Task[None] | None = None
        self._live = False
        self._inflight = 0
        self._entries: dict[str, repository.ModelEntry] = {}
        self._configs: dict[str, model_config_pb2.ModelConfig] = {}
        self._metadata: dict[tuple[str, int], ModelMetadata] = {}
        self._wanted: dict[str, set[int]] = {}
        self._states: dict[str, dict[int, VersionState]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._last_reload: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._entries = await asyncio.to_thread(repository.scan, self._root)
        for name, entry in self._entries.items():
            _warn_if_single_instance(entry.config)
            self._configs[name] = self._transform(entry.config)
            self._wanted[name] = set(entry.selected)
            self._states[name] = dict.fromkeys(entry.selected, VersionState.UNAVAILABLE)  # until Triton says more
            self._locks[name] = asyncio.Lock()
        options = self._channel_options()
        # Model control and the health probe go through tritonclient's client; inference goes straight
        # through the generated stub on its own channel: no InferInput/InferResult wrappers, no extra copies,
        # and the probe's calls never queue behind a burst of inference on the same HTTP/2 connection.
        self._client = triton.InferenceServerClient(self._settings.triton_url, channel_args=options)
        self._channel = grpc.aio.insecure_channel(self._settings.triton_url, options=options)
        self._infer_call = service_pb2_grpc.GRPCInferenceServiceStub(self._channel).ModelInfer
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
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._infer_call = None
        self._live = False

    def _channel_options(self) -> list[tuple[str, Any]]:
        backoff_ms = int(self._settings.triton_reconnect_backoff_s * 1000)
        return [
            ("grpc.max_send_message_length", self._settings.max_body_bytes),
            ("grpc.max_receive_message_length", self._settings.max_body_bytes),
            # Come back within a fraction of a second of Triton's return, not gRPC's default minutes.
            ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
            ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]

    async def live(self) -> bool:
        return self._live

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        return self._states

    # -- model control (gRPC only: a load over HTTP stalls Triton's HTTP inference) -----------------------
    async def load(self, model: str, version: int) -> None:
        # Versions exported after startup are picked up here (the hot switch loads them by number).
        await asyncio.to_thread(repository.refresh, self._entries, model, version)
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
        except GatewayError:
            self._wanted[model] = previous  # what Triton could not do is not wanted: the probe must not retry it
            raise

    async def _apply(self, model: str, versions: set[int]) -> None:
        """Make Triton serve exactly ``versions`` of ``model`` and return once they have settled."""
        timeout = self._settings.triton_load_timeout_s
        try:
            if versions:
                override = _override_json(self._configs[model], versions)
                await self._client.load_model(model, config=override, client_timeout=timeout)
            else:
                await self._client.unload_model(model, client_timeout=timeout)
            await self._settle(model, versions, deadline=time.monotonic() + timeout)
        except InferenceServerException as exc:
            raise self._control_error(exc, f"{'loading' if versions else 'unloading'} model '{model}'") from None
        finally:
            self._last_reload[model] = time.monotonic()

    async def _settle(self, model: str, versions: set[int], *, deadline: float) -> None:
        # Triton answers an unload (and a load that drops versions) while versions are still UNLOADING.
        while True:
            index = await self._index()
            self._update_states(index)
            states = index.get(model, {})
            moving = [v for v, state in states.items() if state in ("LOADING", "UNLOADING")]
            extra = [v for v, state in states.items() if state == "READY" and v not in versions]
            missing = [v for v in versions if states.get(v) != "READY"]
            if not moving and not extra and not missing:
                return
            if not moving and missing:
                raise GatewayError(f"Triton did not load model '{model}' version(s) {sorted(missing)}", 503)
            if time.monotonic() > deadline:
                raise BackendUnavailable(f"model '{model}' did not settle in Triton: {states}")
            await asyncio.sleep(_SETTLE_POLL_S)

    # -- queries (no I/O: the probe keeps the view current) ------------------------------------------------
    async def ready(self, model: str, version: int) -> bool:
        return self._live and self._states.get(model, {}).get(version) is VersionState.READY

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        key = (model, version)
        found = self._metadata.get(key)
        if found is None:
            self._check_known(model, version)
            found = self._metadata[key] = repository.metadata_from_config(self._configs[model], (version,))
        return found

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        self._check_known(model, version)
        config = model_config_pb2.ModelConfig()
        config.CopyFrom(self._configs[model])
        config.version_policy.specific.versions[:] = sorted(self._wanted[model])
        return config

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
        breaker = self._breaker
        if not breaker.allow():
            raise self._unavailable(f"Triton at {self._settings.triton_url} is unavailable (circuit open)")
        if self._inflight >= self._settings.triton_max_inflight:
            breaker.release()
            raise Overloaded(f"{self._inflight} requests are already in flight to Triton")
        message = _infer_request(request, version, timeout_s, priority)
        self._inflight += 1
        started = time.monotonic()
        try:
            if timeout_s is not None:
                # The client timeout ends the call on our side when Triton's own queue timeout does.
                reply = await self._infer_call(message, timeout=timeout_s)
            else:
                # No deadline: only a safety net against a Triton that accepts calls and never answers. A gRPC
                # deadline would cost a timer in gRPC core here and in Triton on every call; the loop's is cheap.
                async with asyncio.timeout(self._settings.triton_infer_timeout_s):
                    reply = await self._infer_call(message)
        except TimeoutError:
            breaker.record_failure()  # a Triton that sits on a call this long is not healthy
            limit = self._settings.triton_infer_timeout_s
            raise DeadlineExceeded(f"Triton did not answer model '{request.model}' within {limit:g} s") from None
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
            raise self._infer_error(code, str(details or ""), request.model, version, timeout_s) from None
        except OSError as exc:
            breaker.record_failure()
            raise self._unavailable(f"Triton at {self._settings.triton_url} is unreachable: {exc}") from None
        finally:
            self._inflight -= 1
        breaker.record_success()
        if self._metrics is not None:
            self._metrics.backend_time(request.model, str(version)).observe(time.monotonic() - started)
        return _infer_response(reply, request, version)

    # -- error translation: the only place Triton's and gRPC's errors are looked at -------------------------
    def _infer_error(
        self, code: str, message: str, model: str, version: int, timeout_s: float | None
    ) -> GatewayError:
        """``code`` is the gRPC status name (``UNAVAILABLE``), ``message`` what Triton or gRPC said."""
        target = f"model '{model}' version {version}"
        if code == "DEADLINE_EXCEEDED" or "timeout expired" in message.lower():
            self._breaker.release()
            budget = "its deadline" if timeout_s is None else f"its {timeout_s * 1e3:.1f} ms deadline"
            return DeadlineExceeded(f"request to {target} did not finish within {budget}")
        if code == "UNAVAILABLE" and not _is_model_state(message):
            if "queue size" in message:
                self._breaker.record_success()
                return Overloaded(f"Triton's queue for {target} is full")
            self._breaker.record_failure()
            return self._unavailable(f"Triton at {self._settings.triton_url} is unavailable: {message}")
        self._breaker.record_success()  # Triton answered: it is up
        if code == "NOT_FOUND" or "is not found" in message or "unknown model" in message:
            return ModelNotFound(f"Triton does not serve {target}")
        if _is_model_state(message):
            return ModelNotReady(f"{target} is not ready in Triton")
        if code == "INVALID_ARGUMENT":
            return InvalidInput(f"Triton rejected the request to {target}: {message}")
        if code == "RESOURCE_EXHAUSTED":
            return Overloaded(f"Triton refused the request to {target}: {message}")
        if code == "CANCELLED":
            return BackendUnavailable(f"Triton cancelled the request to {target}")
        return InferenceFailed(f"{target} failed in Triton: {message}")

    def _control_error(self, exc: InferenceServerException, action: str) -> GatewayError:
        code, message = _code(exc), str(exc.message() or exc)
        if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            detail = f"{action} failed: Triton at {self._settings.triton_url} is unavailable: {message}"
            return self._unavailable(detail, public=True)
        if code == "NOT_FOUND":
            return ModelNotFound(f"{action} failed: {message}")
        return GatewayError(f"{action} failed in Triton: {message}", 503)

    def _unavailable(self, detail: str, *, public: bool = False) -> BackendUnavailable:
        """503 with ``Retry-After``. Inference clients learn that the model server is down, not where it runs
        or what gRPC said (``detail`` goes to the debug log); admin calls (``public``) get the detail."""
        retry = self._breaker.retry_after_s()
        if not public:
            log.debug("Triton unavailable: %s", detail)
        error = BackendUnavailable(detail if public else f"the model server is unavailable; retry in {retry} s")
        error.retry_after_s = retry
        return error

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
        try:
            index = await self._index()
        except GatewayError:
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
                    try:
                        await self._apply(model, set(self._wanted[model]))
                    except GatewayError as exc:  # one broken model must not keep the others from serving
                        log.error("%s", exc)

    async def _index(self) -> dict[str, dict[int, str]]:
        try:
            index = await self._client.get_model_repository_index(
                as_json=True, client_timeout=self._settings.triton_control_timeout_s
            )
        except InferenceServerException as exc:
            raise self._control_error(exc, "reading Triton's repository index") from None
        except (grpc.RpcError, OSError) as exc:
            raise self._unavailable(f"Triton at {self._settings.triton_url} is unreachable: {exc}") from None
        states: dict[str, dict[int, str]] = {}
        for entry in index.get("models", []):
            if entry.get("version"):
                states.setdefault(str(entry["name"]), {})[int(entry["version"])] = str(entry.get("state", ""))
        return states

    def _update_states(self, index: dict[str, dict[int, str]]) -> None:
        for model, wanted in self._wanted.items():
            states = index.get(model, {})
            view = {v: _STATES.get(state, VersionState.UNAVAILABLE) for v, state in states.items() if state in _STATES}
            for v in wanted:
                view.setdefault(v, VersionState.UNAVAILABLE)
            self._states[model] = view


def _warn_if_single_instance(config: model_config_pb2.ModelConfig) -> None:
    """Triton 2.51's dynamic batcher can hold a request ~500 ms when the model's only instance is busy as it
    arrives (its idle wait misses the wake-up); the exporter writes two instances for that reason."""
    instances = sum(group.count or 1 for group in config.instance_group) if config.instance_group else 1
    if config.HasField("dynamic_batching") and instances == 1:
        log.warning(
            "model '%s' has one instance with dynamic batching: Triton can then hold requests ~500 ms; "
            "re-export it with --instances 2 (or set instance_group.count: 2 in its config.pbtxt)",
            config.name,
        )


def _infer_request(
    request: InferRequest, version: int, timeout_s: float | None, priority: int
) -> service_pb2.ModelInferRequest:
    """The v2 request Triton receives: every tensor as raw bytes, the version pinned, the deadline budget as
    Triton's queue ``timeout`` (microseconds; the model's queue policy must allow_timeout_override)."""
    message = service_pb2.ModelInferRequest(model_name=request.model, model_version=str(version), id=request.id)
    for tensor in request.inputs:
        message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_input_contents.append(tensor.data.tobytes())
    if priority:
        message.parameters["priority"].uint64_param = priority
    if timeout_s is not None:
        message.parameters["timeout"].int64_param = max(1, int(timeout_s * 1e6))
    return message


def _infer_response(reply: service_pb2.ModelInferResponse, request: InferRequest, version: int) -> InferResponse:
    """Triton's outputs as arrays over its raw bytes (no copy); ``raw`` keeps the bytes for the gRPC front end."""
    if len(reply.raw_output_contents) != len(reply.outputs):
        raise InferenceFailed(f"Triton answered model '{request.model}' without raw output contents")
    outputs = []
    for tensor, raw in zip(reply.outputs, reply.raw_output_contents, strict=True):
        name, datatype = tensor.name, tensor.datatype  # each read of a protobuf field builds a new str
        try:
            dtype = numpy_dtype(datatype, name)
        except InvalidInput:
            raise InferenceFailed(
                f"model '{request.model}' returned output '{name}' as {datatype}, which the gateway does not serve"
            ) from None
        outputs.append(InferOutput(name, datatype, np.frombuffer(raw, dtype=dtype).reshape(tensor.shape), raw=raw))
    return InferResponse(model=request.model, version=version, id=request.id, outputs=outputs)


def _override_json(config: model_config_pb2.ModelConfig, versions: set[int]) -> str:
    """The complete config with a ``specific`` version policy: Triton replaces config.pbtxt, never merges."""
    message = model_config_pb2.ModelConfig()
    message.CopyFrom(config)
    message.version_policy.specific.versions[:] = sorted(versions)
    return json_format.MessageToJson(message, preserving_proto_field_name=True)


def _code(exc: InferenceServerException) -> str:
    return str(exc.status() or "").removeprefix("StatusCode.")


def _is_model_state(message: str) -> bool:
    return "not at ready state" in message or "is not ready" in message
