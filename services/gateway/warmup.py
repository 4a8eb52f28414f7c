"""Warm-up requests for a model version: the exporter's sample inputs when the version has a manifest, else
the config's ``model_warmup``, else zero-filled inputs of the declared shapes (dynamic dims as 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.datatypes import from_config, numpy_dtype
from services.gateway.types import Array
from services.modelrepo import layout
from services.modelrepo.manifest import read_manifest, read_samples


class WarmupError(Exception):
    """The version's warm-up data cannot be built; the message names the file or tensor at fault."""


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
    inputs = {t.name: np.zeros(_zero_shape(t, config), dtype=_dtype(t)) for t in config.input}
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
            count = math.prod(dims)
            if len(raw) != count * dtype.itemsize:
                raise WarmupError(
                    f"model_warmup '{sample.name}': {path} has {len(raw)} bytes, dims {dims} of "
                    f"{from_config(spec.data_type)} need {count * dtype.itemsize}"
                )
            row = np.frombuffer(raw, dtype=dtype).reshape(dims)
        elif kind == "random_data":
            row = np.random.default_rng(0).standard_normal(dims).astype(dtype)
        else:
            row = np.zeros(dims, dtype=dtype)
        # Triton repeats the sample batch_size times for a batching model.
        inputs[tensor.name] = np.ascontiguousarray(np.broadcast_to(row, (rows, *dims))) if batched else row
    return Warmup(inputs, f"model_warmup '{sample.name}' (batch {rows if batched else 1})")


def _dtype(tensor: mc.ModelInput) -> np.dtype[np.generic]:
    return numpy_dtype(from_config(tensor.data_type), tensor.name)


def _zero_shape(tensor: mc.ModelInput, config: mc.ModelConfig) -> list[int]:
    dims = [1 if int(d) < 0 else int(d) for d in tensor.dims]
    return [1, *dims] if config.max_batch_size > 0 else dims


def _rows(inputs: dict[str, Array], config: mc.ModelConfig) -> int:
    first = next(iter(inputs.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim and config.max_batch_size > 0 else 1
