"""Comparing two versions of a model before a swap: the same requests on both, the largest difference per output.
The requests are the new version's warm-up, plus seeded random rows when the gateway invented the warm-up (zeros,
on which most models answer alike). A request the gateway invented that a version cannot answer is left out of
the comparison and named in its report: invented data never refuses a version (``warmup``)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.backends.base import Backend
from services.gateway.repository import ModelEntry
from services.gateway.tensors.bytes_codec import OBJECT, differing
from services.gateway.tensors.types import Array
from services.gateway.versions.warmup import (
    WarmedUp,
    Warmup,
    WarmupError,
    input_dtype,
    run_request,
    warmup_requests,
    zero_shape,
    zeros,
)

PROBE = "seeded random rows"


def probe_request(config: mc.ModelConfig) -> dict[str, Array]:
    """Two rows of seeded random values (zeros for integer and boolean inputs, empty strings for BYTES): something
    to compare two versions on when the only warm-up data is zeros, on which most models answer alike."""
    generator = np.random.default_rng(0)
    inputs = {}
    for tensor in config.input:
        dtype = input_dtype(tensor)
        shape = zero_shape(tensor, config)
        if config.max_batch_size > 0:
            shape[0] = min(2, int(config.max_batch_size))
        floating = np.issubdtype(dtype, np.floating)
        inputs[tensor.name] = generator.standard_normal(shape).astype(dtype) if floating else zeros(shape, dtype)
    return inputs


async def compare_versions(
    backend: Backend, entry: ModelEntry, new: int, old: int, warmed: WarmedUp | None, timeout_s: float
) -> dict[str, Any]:
    """The same requests on both versions; the largest difference per output (what a swap reports), and
    ``skipped``: why the invented requests that either version could not answer were left out."""
    requests = await comparison_requests(backend, entry, new, warmed)
    after, before, skipped = [], [], []
    new_metadata = await backend.metadata(entry.name, new)
    old_metadata = await backend.metadata(entry.name, old)
    for plan in requests:
        try:
            got = await run_request(backend, new_metadata, entry.name, new, plan.inputs, plan.source, timeout_s)
            had = await run_request(backend, old_metadata, entry.name, old, plan.inputs, plan.source, timeout_s)
        except WarmupError as exc:
            if not plan.invented:
                raise
            skipped.append(str(exc))
            continue
        after.append(got)
        before.append(had)
    found: dict[str, Any] = {"against": old, "max_abs_diff": max_abs_difference(after, before)}
    if skipped:
        found["skipped"] = skipped
    return found


async def comparison_requests(
    backend: Backend, entry: ModelEntry, version: int, warmed: WarmedUp | None
) -> tuple[Warmup, ...]:
    """What a swap runs on the new and the current version to compare them: the warm-up's own requests that were
    answered (built again when the version was loaded earlier), plus seeded random rows when those were invented."""
    config = await backend.config(entry.name, version)
    if warmed is None:
        plans = tuple(await asyncio.to_thread(warmup_requests, entry.path, version, config))
        invented = any(plan.invented for plan in plans)
    else:
        plans, invented = warmed.ran, warmed.invented
    return (*plans, Warmup(probe_request(config), PROBE, invented=True)) if invented else plans


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
