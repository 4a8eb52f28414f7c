"""The embedded backend: runs repository models in-process (onnxruntime / TorchScript), one dynamic
batcher and one small thread pool per loaded version."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2

from exporter.manifest import read_manifest, read_samples
from services.gateway import repository
from services.gateway.backends.runners import OnnxRunner, Runner, TorchScriptRunner
from services.gateway.batcher import BatchPolicy, DynamicBatcher, Observer
from services.gateway.datatypes import numpy_dtype
from services.gateway.errors import GatewayError, ModelNotFound, ModelNotReady
from services.gateway.metrics import GatewayMetrics
from services.gateway.types import (
    Array,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    VersionState,
)

log = logging.getLogger(__name__)


@dataclass
class _Version:
    state: VersionState
    metadata: ModelMetadata
    batcher: DynamicBatcher | None = None
    pool: ThreadPoolExecutor | None = None


class EmbeddedBackend:
    """Serves ``onnxruntime_onnx`` and ``pytorch_libtorch`` models from a repository folder.

    ``priority`` is accepted but not used: the batcher serves requests in arrival order.
    """

    def __init__(
        self,
        repository_path: Path,
        *,
        metrics: GatewayMetrics | None = None,
        intra_op_threads: int | None = None,
        spinning: bool = False,
        adaptive_delay: bool = True,
    ) -> None:
        self._root = repository_path
        self._metrics = metrics
        self._threads = intra_op_threads
        self._spinning = spinning
        self._adaptive_delay = adaptive_delay
        self._entries: dict[str, repository.ModelEntry] = {}
        self._versions: dict[str, dict[int, _Version]] = {}

    async def start(self) -> None:
        self._entries = await asyncio.to_thread(repository.scan, self._root)
        for name, entry in self._entries.items():
            self._versions[name] = {}
            for version in entry.selected:
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
        return {name: {v: s.state for v, s in versions.items()} for name, versions in self._versions.items()}

    async def load(self, model: str, version: int) -> None:
        # Versions exported after startup are picked up here (the hot switch loads them by number).
        entry = await asyncio.to_thread(repository.refresh, self._entries, model, version)
        versions = self._versions.setdefault(model, {})
        current = versions.get(version)
        if current is not None and current.state is VersionState.READY:
            return
        if current is not None and current.state is VersionState.LOADING:
            raise ModelNotReady(f"model '{model}' version {version} is already loading")
        config = entry.config
        instances = max((g.count for g in config.instance_group), default=1) or 1
        threads = self._threads or max(1, (os.cpu_count() or 1) // instances)
        slot = _Version(VersionState.LOADING, entry.metadata((version,)))
        versions[version] = slot
        pool = ThreadPoolExecutor(max_workers=instances, thread_name_prefix=f"{model}-v{version}")
        try:
            runner = await asyncio.get_running_loop().run_in_executor(pool, self._build_runner, entry, version, threads)
        except Exception as exc:
            pool.shutdown(wait=False)
            slot.state = VersionState.UNAVAILABLE
            raise GatewayError(f"loading model '{model}' version {version} failed: {exc}", 503) from exc

        loop = asyncio.get_running_loop()

        async def execute(inputs: dict[str, Array]) -> dict[str, Array]:
            return await loop.run_in_executor(pool, runner.run, inputs)

        slot.batcher = DynamicBatcher(
            execute, _policy(config, instances, self._adaptive_delay), self._observer(model, version)
        )
        slot.pool = pool
        await slot.batcher.start()
        slot.state = VersionState.READY
        log.info(
            "loaded model '%s' version %d (%d instance(s), %d intra-op threads)",
            model,
            version,
            instances,
            threads,
        )

    async def unload(self, model: str, version: int) -> None:
        repository.find(self._entries, model)
        if version not in self._versions.get(model, {}):
            raise ModelNotFound(f"model '{model}' version {version} is not loaded")
        await self._discard(model, version, drain=True)

    async def ready(self, model: str, version: int) -> bool:
        slot = self._versions.get(model, {}).get(version)
        return slot is not None and slot.state is VersionState.READY

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        return self._slot(model, version).metadata

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        self._slot(model, version)
        config = model_config_pb2.ModelConfig()
        config.CopyFrom(self._entries[model].config)
        return config

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        slot = self._slot(request.model, version)
        if slot.state is not VersionState.READY or slot.batcher is None:
            raise ModelNotReady(f"model '{request.model}' version {version} is not ready")
        outputs = await slot.batcher.submit({i.name: i.data for i in request.inputs}, timeout_s=timeout_s)
        return InferResponse(
            model=request.model,
            version=version,
            id=request.id,
            outputs=[InferOutput(spec.name, spec.datatype, outputs[spec.name]) for spec in slot.metadata.outputs],
        )

    def _slot(self, model: str, version: int) -> _Version:
        repository.find(self._entries, model)
        slot = self._versions.get(model, {}).get(version)
        if slot is None:
            raise ModelNotFound(f"model '{model}' has no version {version} loaded")
        return slot

    async def _discard(self, model: str, version: int, *, drain: bool) -> None:
        slot = self._versions[model].pop(version)
        slot.state = VersionState.UNAVAILABLE
        if slot.batcher is not None:
            if drain:
                await slot.batcher.drain()
            await slot.batcher.close()
        if slot.pool is not None:
            slot.pool.shutdown(wait=False)

    def _build_runner(self, entry: repository.ModelEntry, version: int, threads: int) -> Runner:
        """Load the artifact and warm it up with the manifest's samples (runs in the version's pool)."""
        config, folder = entry.config, entry.version_dir(version)
        manifest = read_manifest(folder)
        inputs = [t.name for t in config.input]
        outputs = [t.name for t in config.output]
        runner: Runner
        if config.platform == "onnxruntime_onnx":
            runner = OnnxRunner(folder / manifest.artifact, outputs, intra_op_threads=threads, spinning=self._spinning)
        elif config.platform == "pytorch_libtorch":
            torch.set_num_threads(threads)
            runner = TorchScriptRunner(folder / manifest.artifact, inputs, outputs)
        else:
            raise repository.RepositoryError(f"platform {config.platform!r} is not supported by the embedded backend")
        samples = read_samples(folder, manifest.sample_inputs)
        warm = {name: np.ascontiguousarray(samples[name], dtype=_dtype(entry, name)) for name in inputs}
        # Warm the shapes traffic will bring: the samples, one row, and a full batch (arena growth).
        runner.run(warm)
        if config.max_batch_size > 0:
            runner.run({name: value[:1] for name, value in warm.items()})
            rows = config.max_batch_size
            full = {n: np.resize(v, (rows, *v.shape[1:])) for n, v in warm.items() if v.shape[0] > 0}
            if len(full) == len(warm):
                runner.run(full)
        return runner

    def _observer(self, model: str, version: int) -> Observer | None:
        metrics = self._metrics
        if metrics is None:
            return None
        batch_size = metrics.batch_size.labels(model)
        queue_wait = metrics.queue_wait.labels(model)
        backend = metrics.backend_duration.labels(model, str(version))

        def observe(rows: int, waits: list[float], seconds: float) -> None:
            batch_size.observe(rows)
            for wait in waits:
                queue_wait.observe(wait)
                backend.observe(seconds)

        return observe


def _dtype(entry: repository.ModelEntry, name: str) -> np.dtype[np.generic]:
    spec = next(s for s in entry.metadata(()).inputs if s.name == name)
    return numpy_dtype(spec.datatype, name)


def _policy(config: model_config_pb2.ModelConfig, instances: int, adaptive_delay: bool) -> BatchPolicy:
    dynamic = config.HasField("dynamic_batching")
    batching = config.dynamic_batching
    queue = batching.default_queue_policy
    return BatchPolicy(
        max_batch_size=int(config.max_batch_size),
        preferred_batch_sizes=tuple(int(p) for p in batching.preferred_batch_size),
        max_queue_delay_s=batching.max_queue_delay_microseconds / 1e6,
        instances=instances,
        merge=dynamic and config.max_batch_size > 0,
        max_queue_size=int(queue.max_queue_size),
        default_timeout_s=queue.default_timeout_microseconds / 1e6,
        adaptive_delay=adaptive_delay,
    )
