"""Warm-up for a model version before it takes traffic: the exporter's sample inputs when the version has a
manifest, else the config's ``model_warmup``, else inputs the gateway invents (zeros of the declared shapes, dynamic
dims as 1; empty strings for BYTES, as Triton's ``zero_data``). Declared data must be answered as the config
promises or the version is refused (Triton fails the load on a failing ``model_warmup`` too); invented data is best
effort: Triton would serve the version without any warm-up, so its failure is reported, never a refusal."""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.backends.base import Backend
from services.gateway.errors import GatewayError, InvalidInput
from services.gateway.repository import ModelEntry
from services.gateway.tensors.bytes_codec import OBJECT, deserialize, filled
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
    """Where the data came from, for the log (``manifest samples``, ``model_warmup 'x'``, ``zero-filled``)."""
    invented: bool = False
    """Made up by the gateway, not declared by the model: its failure says little about the model (best effort)."""
    runs: int = 1
    """Executions of this request: a ``model_warmup``'s ``count`` (0 means once, as in Triton). A TorchScript model
    needs a few: its profiling executor optimizes the graph over its first calls, which would otherwise be the
    first clients' requests."""


INVENTED = "zero-filled inputs (no manifest, no model_warmup)"


def warmup_requests(model_dir: Path, version: int, config: mc.ModelConfig) -> list[Warmup]:
    """What to run through a freshly loaded version before it takes traffic. Blocking (reads files)."""
    version_dir = model_dir / str(version)
    if layout.has_manifest(version_dir):
        try:
            manifest = read_manifest(version_dir)
            samples = read_samples(version_dir, manifest.sample_inputs)
        except (OSError, ValueError) as exc:
            raise WarmupError(f"cannot read the warm-up samples of {version_dir}: {exc}") from None
        absent = [t.name for t in config.input if t.name not in samples]
        if absent:
            held = ", ".join(sorted(samples)) or "none"
            raise WarmupError(f"the warm-up samples file {version_dir / manifest.sample_inputs} has no array for "
                              f"input(s) {', '.join(absent)} of config.pbtxt (it holds: {held})")
        inputs = {t.name: np.ascontiguousarray(samples[t.name], dtype=input_dtype(t)) for t in config.input}
        return [Warmup(inputs, f"manifest samples ({rows_of(inputs, config)} rows)")]
    # Triton skips a sample of batch_size 0; with none left it runs no warm-up, and the gateway invents one.
    declared = [sample for sample in config.model_warmup if sample.batch_size > 0]
    if declared:
        return [_from_config(model_dir, config, sample) for sample in declared]
    inputs = {t.name: zeros(zero_shape(t, config), input_dtype(t)) for t in config.input}
    return [Warmup(inputs, INVENTED, invented=True)]


def _from_config(model_dir: Path, config: mc.ModelConfig, sample: mc.ModelWarmup) -> Warmup:
    batched = config.max_batch_size > 0
    rows = int(sample.batch_size)
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
        elif kind == "random_data" and dtype != OBJECT:
            row = np.random.default_rng(0).standard_normal(dims).astype(dtype)
        elif kind in ("zero_data", "random_data"):
            # Triton's random_data for strings is its zero_data: every element an empty string.
            row = zeros(dims, dtype)
        else:
            raise WarmupError(
                f"model_warmup '{sample.name}': input '{tensor.name}' sets none of zero_data, random_data and "
                "input_data_file"
            )
        # Triton sends the sample batch_size times (one row each) in one execution: the same rows, batched.
        inputs[tensor.name] = np.ascontiguousarray(np.broadcast_to(row, (rows, *dims))) if batched else row
    runs = max(int(sample.count), 1)
    times = f", {runs} runs" if runs > 1 else ""
    return Warmup(inputs, f"model_warmup '{sample.name}' (batch {rows if batched else 1}{times})", runs=runs)


def _file_data(raw: bytes, dims: list[int], dtype: np.dtype[Any], where: str, name: str, data_type: int) -> Array:
    """A ``model_warmup`` input file: raw values (Triton reads as many bytes as the dims need, the rest is unused),
    or for strings the whole file in Triton's serialized form."""
    if dtype == OBJECT:
        try:
            return deserialize(raw, tuple(dims), name, kind="warm-up input")
        except InvalidInput as exc:
            raise WarmupError(f"{where}: {exc}") from None
    needed = math.prod(dims) * dtype.itemsize
    if len(raw) < needed:
        raise WarmupError(f"{where} has {len(raw)} bytes, dims {dims} of {from_config(data_type)} need {needed}")
    return np.frombuffer(raw[:needed], dtype=dtype).reshape(dims)


def zeros(shape: list[int], dtype: np.dtype[Any]) -> Array:
    """Zeros, or empty strings for BYTES (Triton's ``zero_data`` for strings: a zero length for every element)."""
    return filled(shape) if dtype == OBJECT else np.zeros(shape, dtype=dtype)


def input_dtype(tensor: mc.ModelInput) -> np.dtype[np.generic]:
    return numpy_dtype(from_config(tensor.data_type), tensor.name)


def zero_shape(tensor: mc.ModelInput, config: mc.ModelConfig) -> list[int]:
    """The declared shape of one row (dynamic dims as 1), batch dim first when the model batches."""
    dims = [1 if int(d) < 0 else int(d) for d in tensor.dims]
    return [1, *dims] if config.max_batch_size > 0 else dims


def rows_of(inputs: dict[str, Array], config: mc.ModelConfig | ModelMetadata) -> int:
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim and config.max_batch_size > 0 else 1


@dataclass(frozen=True)
class WarmedUp:
    ran: tuple[Warmup, ...]
    """The warm-up requests the version answered: a swap runs them on the current version too, to compare."""
    outputs: tuple[dict[str, Array], ...]
    failed: tuple[str, ...] = ()
    """Why the invented requests that failed did (the version serves anyway; the index shows it as a note)."""
    invented: bool = False
    """The warm-up data was made up by the gateway (no manifest, no ``model_warmup``)."""

    @property
    def sources(self) -> tuple[str, ...]:
        """What each answered warm-up request was made of (for the log and the swap report)."""
        return tuple(plan.source for plan in self.ran)


async def warm_up(backend: Backend, entry: ModelEntry, version: int, *, timeout_s: float) -> WarmedUp:
    """Run the version's warm-up requests through the backend, as traffic will reach it (validation, batcher,
    Triton), plus one row and a full batch so that memory arenas grow now and not under the first burst.
    A ``model_warmup`` sample runs its ``count`` of times, unless the model server ran it that often itself as it
    loaded the version (Triton).
    Raises ``WarmupError`` naming the request and what was wrong with its answer when the data was declared (a
    manifest's samples, the config's ``model_warmup``); what failed of the data the gateway made up (invented
    inputs, the extra batch sizes, which Triton does not run) is in ``failed``."""
    config = await backend.config(entry.name, version)
    metadata = await backend.metadata(entry.name, version)
    plans = await asyncio.to_thread(warmup_requests, entry.path, version, config)
    repeats = not getattr(backend, "runs_model_warmup", False)  # a backend that does not say: the gateway repeats
    ran, outputs, failed = [], [], []
    for plan in plans:
        try:
            for _ in range(plan.runs if repeats else 1):  # each answer checked: a later, optimized call may differ
                answer = await run_request(backend, metadata, entry.name, version, plan.inputs, plan.source, timeout_s)
        except WarmupError as exc:
            if not plan.invented:
                raise
            failed.append(str(exc))
            continue
        ran.append(plan)
        outputs.append(answer)
    first = ran[0].inputs if ran else {}
    if config.max_batch_size > 0 and first:
        for rows in sorted({1, int(config.max_batch_size)} - {rows_of(first, config)}):
            resized = {n: np.ascontiguousarray(np.resize(v, (rows, *v.shape[1:]))) for n, v in first.items()}
            try:
                await run_request(backend, metadata, entry.name, version, resized, f"a batch of {rows}", timeout_s)
            except WarmupError as exc:
                failed.append(str(exc))
    return WarmedUp(tuple(ran), tuple(outputs), tuple(failed), any(plan.invented for plan in plans))


_SEQUENCE_IDS = itertools.count(2**62)
"""Correlation ids of the gateway's own requests to sequence-batched models: far from those clients count up from."""


async def run_request(
    backend: Backend,
    metadata: ModelMetadata,
    model: str,
    version: int,
    inputs: dict[str, Array],
    source: str,
    timeout_s: float,
) -> dict[str, Array]:
    """One request the gateway makes (warm-up, comparison) through validation and the backend, its answer checked
    against the config; ``WarmupError`` naming ``source`` when it fails."""
    rows = rows_of(inputs, metadata)
    if rows > 1 and (await backend.config(model, version)).HasField("sequence_batching"):
        # Triton's sequence batcher takes one row per request: each row goes as a sequence of its own.
        answers = [
            await run_request(backend, metadata, model, version, {n: a[row : row + 1] for n, a in inputs.items()},
                              f"{source}, row {row + 1}", timeout_s)
            for row in range(rows)
        ]
        return {name: np.concatenate([answer[name] for answer in answers]) for name in answers[0]}
    if backend.decoupled(model):
        return await _run_streamed(backend, metadata, model, version, inputs, source, timeout_s)
    answer = await _run_one(backend, metadata, model, version, inputs, source, timeout_s)
    _check_outputs(metadata, answer, rows, source)
    return answer


async def _run_streamed(
    backend: Backend,
    metadata: ModelMetadata,
    model: str,
    version: int,
    inputs: dict[str, Array],
    source: str,
    timeout_s: float,
) -> dict[str, Array]:
    """A decoupled model's request (Triton refuses it as a unary call): every response it sends, each checked like a
    unary answer; the answer is their outputs one after the other (rows concatenated), so that two versions compare
    on the whole sequence. Responses with no outputs (a final flag alone) add nothing."""
    request = InferRequest(model, version, _tensors(metadata, inputs), id="switchyard-warmup")
    rows = rows_of(inputs, metadata)
    answers: list[dict[str, Array]] = []
    try:
        validate(request, metadata)
        async with asyncio.timeout(timeout_s):
            async for response in backend.infer_stream(request, version=version, timeout_s=timeout_s, priority=0):
                if response.outputs:
                    answers.append({output.name: output.data for output in response.outputs})
    except TimeoutError:
        raise WarmupError(f"warm-up request ({source}) got no final response within {timeout_s:g} s") from None
    except GatewayError as exc:
        raise WarmupError(f"warm-up request ({source}) failed after {len(answers)} response(s): {exc}") from None
    for index, answer in enumerate(answers):
        _check_outputs(metadata, answer, rows, f"{source}, response {index + 1}")
    names = dict.fromkeys(name for answer in answers for name in answer)
    return {name: np.concatenate([answer[name] for answer in answers if name in answer]) for name in names}


async def _run_one(
    backend: Backend,
    metadata: ModelMetadata,
    model: str,
    version: int,
    inputs: dict[str, Array],
    source: str,
    timeout_s: float,
) -> dict[str, Array]:
    tensors = _tensors(metadata, inputs)
    sequenced = (await backend.config(model, version)).HasField("sequence_batching")
    # Behind Triton's sequence batcher every request must name its sequence: each of these is one of its own.
    parameters = (
        {"sequence_id": next(_SEQUENCE_IDS), "sequence_start": True, "sequence_end": True} if sequenced else {}
    )
    request = InferRequest(model, version, tensors, id="switchyard-warmup", parameters=parameters)
    try:
        validate(request, metadata)
        async with asyncio.timeout(timeout_s):
            response = await backend.infer(request, version=version, timeout_s=timeout_s, priority=0)
    except TimeoutError:
        raise WarmupError(f"warm-up request ({source}) got no answer within {timeout_s:g} s") from None
    except GatewayError as exc:
        raise WarmupError(f"warm-up request ({source}) failed: {exc}") from None
    return {output.name: output.data for output in response.outputs}


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


def _tensors(metadata: ModelMetadata, inputs: dict[str, Array]) -> list[InferInput]:
    return [InferInput(name, _datatype(metadata, name), tuple(a.shape), a) for name, a in inputs.items()]


def _datatype(metadata: ModelMetadata, name: str) -> str:
    return next((spec.datatype for spec in metadata.inputs if spec.name == name), "")
