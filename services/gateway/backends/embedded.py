"""The embedded backend: runs repository models in-process (onnxruntime / TorchScript), one dynamic
batcher and one small thread pool per loaded version."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2, service_pb2

from services.extras import MissingExtra
from services.gateway import repository
from services.gateway.backends.base import describe_problem
from services.gateway.backends.devices import CPU, InstancePlan, NoUsableGpu, gpus, plan_instances
from services.gateway.backends.loop_holds import LOOP_HOLDS
from services.gateway.backends.placement import Placement
from services.gateway.backends.priming import prime_model_runtime
from services.gateway.backends.reshape import Reshaped, reshapes
from services.gateway.backends.runners import (
    Runner,
    UnsupportedModel,
    build_runner,
    check_string_ranks,
    check_supported,
    runtime_inputs,
)
from services.gateway.batching.batcher import BatchPolicy, DynamicBatcher, ExecutedBatch, Observer
from services.gateway.errors import GatewayError, ModelNotReady, unknown_version, version_not_ready
from services.gateway.metrics import GatewayMetrics
from services.gateway.statistics import VersionStatistics
from services.gateway.tensors.types import InferOutput, InferRequest, InferResponse, ModelMetadata, VersionState
from services.gateway.tracing.spans import CURRENT
from services.modelrepo import layout

log = logging.getLogger(__name__)
DECOUPLED_PROBLEM = (
    "decoupled models (model_transaction_policy { decoupled: true }) need Triton: serve this repository with "
    "--backend triton"
)
"""Why a model that may answer a request with many responses is not loaded: the embedded runtimes answer once."""


@dataclass
class _Version:
    state: VersionState
    metadata: ModelMetadata
    config: model_config_pb2.ModelConfig
    """The config this version was loaded with (a re-exported config.pbtxt applies to the next load)."""
    batcher: DynamicBatcher | None = None
    pool: ThreadPoolExecutor | None = None
    placement: Placement | None = None
    problem: str | None = None
    plan: InstancePlan | None = None
    """Where its instances run (``devices.py``)."""
    statistics: VersionStatistics = field(default_factory=VersionStatistics)
    """Counted from this load on: a version loaded again starts afresh, as in Triton."""


class EmbeddedBackend:
    """Serves ``onnxruntime_onnx`` and ``pytorch_libtorch`` models from a repository folder; other models are
    reported unavailable with the reason.

    ``priority`` orders each version's batch queue (lower first); the queue is bounded by the config's
    ``max_queue_size`` or, without one, by ``max_queue``.
    """

    def __init__(
        self,
        catalog: repository.Catalog,
        *,
        metrics: GatewayMetrics | None = None,
        intra_op_threads: int | None = None,
        spinning: bool = False,
        adaptive_delay: bool = True,
        max_queue: int = 1024,
        inline_below_s: float = 0.0,
        cores: int | None = None,
        gpu_fallback: str = "none",
    ) -> None:
        """``cores``: this process's share of the machine's cores (``serve --workers N``: CPU count / N), which a
        version's instances split between them unless ``intra_op_threads`` says otherwise."""
        self._cores = cores
        self._gpu_fallback = gpu_fallback
        self._max_queue = max_queue
        self._inline_below_s = inline_below_s
        self.traced = False
        """Set by the app when tracing is on: requests then record their batch's queue wait and run."""
        self._catalog = catalog
        self._metrics = metrics
        self._threads = intra_op_threads
        self._spinning = spinning
        self._adaptive_delay = adaptive_delay
        self._versions: dict[str, dict[int, _Version]] = {}

    shared_server = False
    enforces_deadlines = True  # the batcher fails a request at its deadline, queued or running
    runs_model_warmup = False  # the gateway's warm-up runs each sample its count of times
    forwards_parameters = False  # onnxruntime and TorchScript take tensors only

    async def adopt(self, model: str, versions: Collection[int]) -> None:
        """Every gateway runs its own copies: nothing to adopt."""

    async def start(self, initial: Mapping[str, Collection[int]]) -> None:
        for name, versions in initial.items():
            for version in sorted(versions):
                try:
                    await self.load(name, version)
                except GatewayError as exc:  # one broken version must not keep the others from serving
                    log.error("%s", exc)

    async def close(self) -> None:
        for name, versions in self._versions.items():
            for version in list(versions):
                await self._discard(name, version, drain=False)

    async def live(self) -> bool:
        return True

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        loaded = self._versions
        return {
            name: {v: slot.state for v, slot in loaded[name].items()} if name in loaded else {}
            for name in self._catalog.entries
        }

    def state(self, model: str, version: int) -> VersionState | None:
        slot = self._versions.get(model, {}).get(version)
        return None if slot is None else slot.state

    def problem(self, model: str, version: int | None = None) -> str | None:
        entry = self._catalog.entries.get(model)
        if entry is None:
            return None
        versions = self._versions.get(model, {})
        failures = {v: slot.problem for v, slot in versions.items() if slot.problem}
        serving = any(slot.state is VersionState.READY for slot in versions.values())
        return describe_problem(_model_problem(entry, self._gpu_fallback), failures, serving, version)

    async def prime_runtime(self, model: str) -> bool:
        """Start the runtime ``model`` runs on, on each device its instances use, once per process and apart from
        any load (``priming``): the model cache calls it before it measures a load. True when it started one now."""
        entry = self._catalog.entry(model)
        # On a thread: placing the instances may import torch to look for GPUs.
        return await asyncio.to_thread(prime_model_runtime, entry.config, entry.platform, self._gpu_fallback)

    async def load(self, model: str, version: int) -> None:
        # Re-read from disk: versions exported after startup and a re-exported config count.
        entry = await asyncio.to_thread(self._catalog.refresh, model, version)
        problem = _model_problem(entry, self._gpu_fallback)
        if problem is not None:
            raise ModelNotReady(f"model '{model}' is unavailable: {problem}")
        plan = plan_instances(entry.config, entry.platform, fallback=self._gpu_fallback)
        versions = self._versions.setdefault(model, {})
        current = versions.get(version)
        if current is not None and current.state is VersionState.READY:
            return
        if current is not None and current.state is VersionState.LOADING:
            raise ModelNotReady(f"model '{model}' version {version} is already loading")
        config = entry.config
        instances = len(plan.devices)
        threads = self._threads or max(1, (self._cores or os.cpu_count() or 1) // instances)
        slot = _Version(VersionState.LOADING, entry.metadata((version,)), config)
        versions[version] = slot
        pool = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"{model}-v{version}")
        try:
            try:
                runner = await asyncio.get_running_loop().run_in_executor(
                    pool, self._build_runner, entry, version, threads, plan
                )
            except NoUsableGpu:
                if self._gpu_fallback != "cpu":
                    raise
                # The GPU was offered but would not start for this model: the fallback the operator allowed.
                plan = InstancePlan(tuple(CPU for _ in plan.devices), True, plan.tensorrt)
                runner = await asyncio.get_running_loop().run_in_executor(
                    pool, self._build_runner, entry, version, threads, plan
                )
        except asyncio.CancelledError:
            self._abandon(model, version, slot, pool)
            raise
        except Exception as exc:
            pool.shutdown(wait=False)
            slot.state = VersionState.UNAVAILABLE
            slot.problem = f"loading failed: {exc}"
            raise GatewayError(f"loading model '{model}' version {version} failed: {exc}", 503) from exc

        if runner.data_dependent:
            log.info(
                "model '%s' version %d: its run time can follow input values (%s), so its batches always run on its "
                "worker threads", model, version, ", ".join(sorted(runner.data_dependent)),
            )
        placement = Placement(
            runner.run,
            pool,
            batching=config.max_batch_size > 0,
            inline_below_s=self._inline_below_s,
            steady=not runner.data_dependent,
            label=f"'{model}' version {version}",
        )
        slot.batcher = DynamicBatcher(
            placement.execute,
            _policy(config, instances, self._adaptive_delay, self._max_queue),
            self._observer(model, version, slot.statistics),
            beside=placement.on_thread,
            worth_waiting=placement.worth_waiting,
            ahead=placement.forms_ahead,
        )
        slot.placement = placement
        slot.pool = pool
        try:
            await slot.batcher.start()
        except asyncio.CancelledError:
            await slot.batcher.close()
            self._abandon(model, version, slot, pool)
            raise
        slot.state = VersionState.READY
        slot.plan = plan
        self._count_instances(model, version, plan, 1)
        if plan.fell_back:
            log.warning("model '%s' version %d: its KIND_GPU instances run on the CPU (SWITCHYARD_GPU_FALLBACK=cpu): "
                        "%s", model, version, gpus(entry.platform).why_not or "not every GPU it lists is visible")
        log.info(
            "loaded model '%s' version %d (%d instance(s) on %s, %d intra-op threads)",
            model, version, instances, ", ".join(str(d) for d in plan.devices), threads,
        )

    def devices(self, model: str, version: int) -> dict[str, Any] | None:
        """Where a loaded version's instances run: each one's device, and whether the GPU fallback put them there."""
        slot = self._versions.get(model, {}).get(version)
        if slot is None or slot.plan is None:
            return None
        return {"instances": [str(d) for d in slot.plan.devices], "gpu_fallback": slot.plan.fell_back}

    async def unload(self, model: str, version: int) -> None:
        self._catalog.entry(model)
        if version not in self._versions.get(model, {}):
            raise unknown_version(model, version, "not loaded")
        await self._discard(model, version, drain=True)

    async def ready(self, model: str, version: int) -> bool:
        slot = self._versions.get(model, {}).get(version)
        return slot is not None and slot.state is VersionState.READY

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        return self._slot(model, version).metadata

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        config = model_config_pb2.ModelConfig()
        config.CopyFrom(self._slot(model, version).config)
        return config

    def trace(self) -> None:
        """Tracing is on: each traced request records its batch's queue wait and run."""
        self.traced = True

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        versions = self._versions.get(request.model)
        slot = versions.get(version) if versions is not None else None
        if slot is None:
            slot = self._slot(request.model, version)  # raises, naming what is missing
        batcher = slot.batcher
        if slot.state is not VersionState.READY or batcher is None:
            raise version_not_ready(request.model, version, slot.state.value.lower())
        inputs = runtime_inputs(slot.config, request.model, request.inputs)  # BYTES as the runtime's text
        statistics, began = slot.statistics, time.perf_counter()
        trace = CURRENT.get() if self.traced else None
        timing: list[float] | None = None if trace is None else [time.monotonic()]
        try:
            outputs = await batcher.submit(inputs, timeout_s=timeout_s, priority=priority, timing=timing)
        except (Exception, asyncio.CancelledError):  # refused, expired, cancelled or failed: Triton's "fail"
            statistics.failed(time.perf_counter() - began)
            raise
        if trace is not None and timing is not None and len(timing) == 4:
            trace.batch(*timing)
        metadata = slot.metadata
        first = request.inputs[0].data if request.inputs else None
        rows = int(first.shape[0]) if metadata.max_batch_size > 0 and first is not None and first.ndim else 1
        statistics.succeeded(rows, time.perf_counter() - began)
        return InferResponse(
            model=request.model,
            version=version,
            id=request.id,
            outputs=[InferOutput(spec.name, spec.datatype, outputs[spec.name]) for spec in metadata.outputs],
        )

    def decoupled(self, model: str) -> bool:
        return False  # never loaded here (DECOUPLED_PROBLEM)

    async def infer_stream(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> AsyncIterator[InferResponse]:
        yield await self.infer(request, version=version, timeout_s=timeout_s, priority=priority)

    async def statistics(self, model: str | None, version: int | None) -> list[service_pb2.ModelStatistics]:
        """This gateway's own counters of the ready versions of ``model`` (``None``: every model), or of one."""
        found = []
        for name in sorted(self._versions) if model is None else [model]:
            for number, slot in sorted(self._versions.get(name, {}).items()):
                if slot.state is VersionState.READY and version in (None, number):
                    found.append(slot.statistics.message(name, number))
        return found

    def _slot(self, model: str, version: int) -> _Version:
        self._catalog.entry(model)
        slot = self._versions.get(model, {}).get(version)
        if slot is None:
            raise unknown_version(model, version, "not loaded")
        return slot

    def _count_instances(self, model: str, version: int, plan: InstancePlan, sign: int) -> None:
        if self._metrics is None:
            return
        fallback = "cpu" if plan.fell_back else "none"
        for device in set(plan.devices):
            labels = (model, str(version), str(device), fallback)
            if sign > 0:
                self._metrics.model_instances.labels(*labels).set(plan.devices.count(device))
            else:
                with contextlib.suppress(KeyError):
                    self._metrics.model_instances.remove(*labels)

    def _abandon(self, model: str, version: int, slot: _Version, pool: ThreadPoolExecutor) -> None:
        """A load whose caller went away (a gRPC client's deadline, a cancelled action) leaves nothing: its version
        is not left LOADING, which would refuse every later load. A model file being read is read to the end on the
        pool's thread, then dropped with it."""
        if self._versions.get(model, {}).get(version) is slot:
            del self._versions[model][version]
        slot.state = VersionState.UNAVAILABLE
        pool.shutdown(wait=False)

    async def _discard(self, model: str, version: int, *, drain: bool) -> None:
        slot = self._versions[model].pop(version)
        slot.state = VersionState.UNAVAILABLE
        if slot.plan is not None:
            self._count_instances(model, version, slot.plan, -1)
        if slot.batcher is not None:
            if drain:
                await slot.batcher.drain()
            await slot.batcher.close()
        if slot.pool is not None:
            slot.pool.shutdown(wait=False)

    def _build_runner(self, entry: repository.ModelEntry, version: int, threads: int, plan: InstancePlan) -> Runner:
        """Open the model file (runs in the version's pool); the version manager warms it up afterwards."""
        config = entry.config
        path = entry.model_path(version)
        assert path is not None  # _model_problem refuses models without a model file
        check_string_ranks(config, entry.name)
        with LOOP_HOLDS.holding():  # torch.jit.load keeps the GIL, and so the event loop, for the whole read
            runner = build_runner(
                entry.platform,
                path,
                [t.name for t in config.input],
                [t.name for t in config.output],
                threads=threads,
                spinning=self._spinning,
                devices=plan.devices,
                tensorrt=plan.tensorrt,
            )
        return Reshaped(runner, config) if any(reshapes(config)) else runner

    def _observer(self, model: str, version: int, statistics: VersionStatistics) -> Observer:
        metrics = self._metrics
        if metrics is None:
            return statistics.executed
        batch_size = metrics.batch_size.labels(model)
        queue_wait = metrics.queue_wait.labels(model)
        backend = metrics.backend_duration.labels(model, str(version))

        def observe(batch: ExecutedBatch) -> None:
            statistics.executed(batch)
            batch_size.observe(batch.rows)
            seconds = batch.merge_s + batch.execute_s + batch.split_s
            for wait in batch.waits:
                queue_wait.observe(wait)
            backend.observe_times(seconds, len(batch.waits))

        return observe


def _model_problem(entry: repository.ModelEntry, gpu_fallback: str = "none") -> str | None:
    """Why no version of the model can run here, whatever is on disk; ``None`` when it can be tried."""
    if entry.problem is not None:
        return entry.problem
    if entry.config.model_transaction_policy.decoupled:  # before the platform: the reason that tells what to do
        return DECOUPLED_PROBLEM
    try:
        check_supported(entry.platform)
    except (UnsupportedModel, MissingExtra) as exc:
        return str(exc)
    if not entry.available:
        return f"no version folder under {entry.path} holds {layout.model_filename(entry.config)}"
    try:
        plan_instances(entry.config, entry.platform, fallback=gpu_fallback)
    except NoUsableGpu as exc:
        return str(exc)
    return None


def _policy(
    config: model_config_pb2.ModelConfig, instances: int, adaptive_delay: bool, max_queue: int
) -> BatchPolicy:
    dynamic = config.HasField("dynamic_batching")
    batching = config.dynamic_batching
    queue = batching.default_queue_policy
    return BatchPolicy(
        max_batch_size=int(config.max_batch_size),
        preferred_batch_sizes=tuple(int(p) for p in batching.preferred_batch_size),
        max_queue_delay_s=batching.max_queue_delay_microseconds / 1e6,
        instances=instances,
        merge=dynamic and config.max_batch_size > 0,
        max_queue_size=int(queue.max_queue_size) or max_queue,
        default_timeout_s=queue.default_timeout_microseconds / 1e6,
        adaptive_delay=adaptive_delay,
    )

