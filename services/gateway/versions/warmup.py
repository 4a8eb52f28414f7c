"""Warm-up for a model version before it takes traffic: the exporter's sample inputs when the version has a
manifest, else the config's ``model_warmup``, else zero-filled inputs of the declared shapes (dynamic dims as 1;
empty strings for BYTES), run through the backend and checked against the config."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.backends.base import Backend
from services.gateway.errors import GatewayError, InvalidInput
from services.gateway.repository import ModelEntry
from services.gateway.tensors.bytes_codec import OBJECT, deserialize, differing, filled
from services.gateway.tensors.datatypes import from_config, numpy_dtype
from services.gateway.tensors.types import Array, InferInput, InferRequest, ModelMetadata
from services.gateway.tensors.validation import validate
from services.modelrepo import layout
from services.modelrepo.manifest import read_manifest, read_samples


class WarmupError(GatewayError):
    """A version's warm-up (or comparison) request could not be built or was answered wrongly; the message names
    the file, tensor or output at fault. The version's own fault: 422."""

    status = 422


@dataclass(frozen=True)
class Warmup:
    inputs: dict[str, Array]
    """One request: every input keyed by config name, batch dim first when the model batches."""
    source: str
    """Where the data came from, for the log (``manifest samples``, ``model_warmup 'x'``, ``zeros``)."""


def warmup_requests(model_dir: Path, version: int, config: mc.ModelConfig) -> list[Warmup]:
    """What to run through a freshly loaded version before it takes traffic. Blocking (reads files)."""
    version_dir = model_dir / str(version)
    if layout.has_manifest(version_dir):
        try:
            manifest = read_manifest(version_dir)
            samples = read_samples(version_dir, manifest.sample_inputs)
        except (OSError, ValueError) as exc:
            raise WarmupError(f"cannot read the warm-up samples of {version_dir}: {exc}") from None
        inputs = {t.name: np.ascontiguousarray(samples[t.name], dtype=_dtype(t)) for t in config.input}
        return [Warmup(inputs, f"manifest samples ({_rows(inputs, config)} rows)")]
    if config.model_warmup:
        return [_from_config(model_dir, config, sample) for sample in config.model_warmup]
    inputs = {t.name: _zeros(_zero_shape(t, config), _dtype(t)) for t in config.input}
    return [Warmup(inputs, "zero-filled inputs (no manifest, no model_warmup)")]


def _from_config(model_dir: Path, config: mc.ModelConfig, sample: mc.ModelWarmup) -> Warmup:
    batched = config.max_batch_size > 0
    rows = max(int(sample.batch_size), 1)
    inputs: dict[str, Array] = {}
    for tensor in config.input:
        spec = sample.inputs.get(tensor.name)
        if spec is None:
            raise WarmupError(f"model_warmup '{sample.name}' of model '{config.name}' has no input '{tensor.name}'")
        dims = [int(d) for d in spec.dims]
        dtype = numpy_dtype(from_config(spec.data_type), tensor.name)
        kind = spec.WhichOneof("input_data_type")
        if kind == "input_data_file":
            path = model_dir / layout.WARMUP_DIR / spec.input_data_file
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise WarmupError(f"model_warmup '{sample.name}': cannot read {path}: {exc.strerror}") from None
            row = _file_data(raw, dims, dtype, f"model_warmup '{sample.name}': {path}", tensor.name, spec.data_type)
        elif kind == "random_data" and dtype != OBJECT:  # strings fall back to zero_data, as in Triton
            row = np.random.default_rng(0).standard_normal(dims).astype(dtype)
        else:
            row = _zeros(dims, dtype)
        # Triton repeats the sample batch_size times for a batching model.
        inputs[tensor.name] = np.ascontiguousarray(np.broadcast_to(row, (rows, *dims))) if batched else row
    return Warmup(inputs, f"model_warmup '{sample.name}' (batch {rows if batched else 1})")


def _file_data(raw: bytes, dims: list[int], dtype: np.dtype[Any], where: str, name: str, data_type: int) -> Array:
    """A ``model_warmup`` input file: raw values, or for strings Triton's serialized form."""
    if dtype == OBJECT:
        try:
            return deserialize(raw, tuple(dims), name, kind="warm-up input")
        except InvalidInput as exc:
            raise WarmupError(f"{where}: {exc}") from None
    count = math.prod(dims)
    if len(raw) != count * dtype.itemsize:
        raise WarmupError(
            f"{where} has {len(raw)} bytes, dims {dims} of {from_config(data_type)} need {count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def _zeros(shape: list[int], dtype: np.dtype[Any]) -> Array:
    """Zeros, or empty strings for BYTES (Triton's ``zero_data`` for strings reads as empty strings too)."""
    return filled(shape) if dtype == OBJECT else np.zeros(shape, dtype=dtype)


def _dtype(tensor: mc.ModelInput) -> np.dtype[np.generic]:
    return numpy_dtype(from_config(tensor.data_type), tensor.name)


def _zero_shape(tensor: mc.ModelInput, config: mc.ModelConfig) -> list[int]:
    dims = [1 if int(d) < 0 else int(d) for d in tensor.dims]
    return [1, *dims] if config.max_batch_size > 0 else dims


def _rows(inputs: dict[str, Array], config: mc.ModelConfig | ModelMetadata) -> int:
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim and config.max_batch_size > 0 else 1


@dataclass(frozen=True)
class WarmedUp:
    sources: tuple[str, ...]
    """What each warm-up request was made of (for the log and the swap report)."""
    requests: tuple[dict[str, Array], ...]
    """The inputs that ran: a swap runs them on the current version too, to compare."""
    outputs: tuple[dict[str, Array], ...]


async def warm_up(backend: Backend, entry: ModelEntry, version: int, *, timeout_s: float) -> WarmedUp:
    """Run the version's warm-up requests through the backend, as traffic will reach it (validation, batcher,
    Triton), plus one row and a full batch so that memory arenas grow now and not under the first burst.
    Raises ``WarmupError`` naming the request and what was wrong with its answer."""
    config = await backend.config(entry.name, version)
    metadata = await backend.metadata(entry.name, version)
    plans = await asyncio.to_thread(warmup_requests, entry.path, version, config)
    outputs = []
    for plan in plans:
        outputs.append(await _run(backend, metadata, entry.name, version, plan.inputs, plan.source, timeout_s))
    first = plans[0].inputs if plans else {}
    if config.max_batch_size > 0 and first:
        sizes = {1, int(config.max_batch_size)} - {_rows(first, config)}
        for rows in sorted(sizes):
            resized = {n: np.ascontiguousarray(np.resize(v, (rows, *v.shape[1:]))) for n, v in first.items()}
            await _run(backend, metadata, entry.name, version, resized, f"a batch of {rows}", timeout_s)
    return WarmedUp(tuple(p.source for p in plans), tuple(p.inputs for p in plans), tuple(outputs))


def probe_request(config: mc.ModelConfig) -> dict[str, Array]:
    """Two rows of seeded random values (zeros for integer and boolean inputs, empty strings for BYTES): something
    to compare two versions on when the only warm-up data is zeros, on which most models answer alike."""
    generator = np.random.default_rng(0)
    inputs = {}
    for tensor in config.input:
        dtype = _dtype(tensor)
        shape = _zero_shape(tensor, config)
        if config.max_batch_size > 0:
            shape[0] = min(2, int(config.max_batch_size))
        floating = np.issubdtype(dtype, np.floating)
        inputs[tensor.name] = generator.standard_normal(shape).astype(dtype) if floating else _zeros(shape, dtype)
    return inputs


async def compare_versions(
    backend: Backend, entry: ModelEntry, new: int, old: int, warmed: WarmedUp | None, timeout_s: float
) -> dict[str, Any]:
    """The same requests on both versions; the largest difference per output (what a swap reports)."""
    requests = await comparison_requests(backend, entry, new, warmed)
    after = await run_requests(backend, entry.name, new, requests, timeout_s=timeout_s)
    before = await run_requests(backend, entry.name, old, requests, timeout_s=timeout_s)
    return {"against": old, "max_abs_diff": max_abs_difference(after, before)}


async def comparison_requests(
    backend: Backend, entry: ModelEntry, version: int, warmed: WarmedUp | None
) -> tuple[dict[str, Array], ...]:
    """What a swap runs on the new and the current version to compare them: the warm-up's own requests (built
    again when the version was loaded earlier), plus seeded random rows when those are only zeros."""
    config = await backend.config(entry.name, version)
    if warmed is None:
        plans = await asyncio.to_thread(warmup_requests, entry.path, version, config)
        warmed = WarmedUp(tuple(p.source for p in plans), tuple(p.inputs for p in plans), ())
    requests = list(warmed.requests)
    if any(source.startswith("zero-filled") for source in warmed.sources):
        requests.append(probe_request(config))
    return tuple(requests)


async def run_requests(
    backend: Backend, model: str, version: int, requests: tuple[dict[str, Array], ...], *, timeout_s: float
) -> list[dict[str, Array]]:
    """The same inputs on another version (the one a swap replaces), for the comparison."""
    metadata = await backend.metadata(model, version)
    return [await _run(backend, metadata, model, version, inputs, "comparison", timeout_s) for inputs in requests]


def max_abs_difference(new: list[dict[str, Array]], old: list[dict[str, Array]]) -> dict[str, float | str]:
    """Per output, the largest |new - old| over every request (or why they cannot be compared); BYTES outputs
    have no distance: 0 when equal, else how many strings differ."""
    worst: dict[str, float | str] = {}
    for got, had in zip(new, old, strict=True):
        for name, value in got.items():
            if name not in had:
                worst[name] = "missing from the current version's answer"
            elif value.shape != had[name].shape:
                worst[name] = f"shape {list(value.shape)} vs {list(had[name].shape)}"
            elif value.dtype == OBJECT or had[name].dtype == OBJECT:
                changed = differing(value, had[name]) if value.dtype == had[name].dtype else value.size
                if changed and not isinstance(worst.get(name), str):
                    worst[name] = f"{changed} of {value.size} strings differ"
                else:
                    worst.setdefault(name, 0.0)
            elif not isinstance(worst.get(name, 0.0), str):
                diff = float(np.max(np.abs(value.astype(np.float64) - had[name].astype(np.float64)), initial=0.0))
                # JSON has no NaN: a version that answers NaN or inf says so in words.
                worst[name] = max(float(worst.get(name, 0.0)), diff) if math.isfinite(diff) else "not finite"
    return worst


async def _run(
    backend: Backend,
    metadata: ModelMetadata,
    model: str,
    version: int,
    inputs: dict[str, Array],
    source: str,
    timeout_s: float,
) -> dict[str, Array]:
    tensors = [InferInput(name, _datatype(metadata, name), tuple(a.shape), a) for name, a in inputs.items()]
    request = InferRequest(model, version, tensors, id="switchyard-warmup")
    try:
        validate(request, metadata)
        async with asyncio.timeout(timeout_s):
            response = await backend.infer(request, version=version, timeout_s=timeout_s, priority=0)
    except TimeoutError:
        raise WarmupError(f"warm-up request ({source}) got no answer within {timeout_s:g} s") from None
    except GatewayError as exc:
        raise WarmupError(f"warm-up request ({source}) failed: {exc}") from None
    answer = {output.name: output.data for output in response.outputs}
    _check_outputs(metadata, answer, _rows(inputs, metadata), source)
    return answer


def _check_outputs(metadata: ModelMetadata, answer: dict[str, Array], rows: int, source: str) -> None:
    """The answer must be what the config promises: every output, its dtype, its batch and fixed dims."""
    for spec in metadata.outputs:
        value = answer.get(spec.name)
        if value is None:
            raise WarmupError(f"warm-up request ({source}): the answer has no output '{spec.name}'")
        expected = [rows, *spec.dims] if metadata.max_batch_size > 0 else list(spec.dims)
        shape = list(value.shape)
        if len(shape) != len(expected) or any(want not in (-1, got) for want, got in zip(expected, shape, strict=True)):
            raise WarmupError(
                f"warm-up request ({source}): output '{spec.name}' has shape {shape}, the config declares "
                f"{metadata.served_shape(spec)} for {rows} row(s)"
            )


def _datatype(metadata: ModelMetadata, name: str) -> str:
    return next((spec.datatype for spec in metadata.inputs if spec.name == name), "")
