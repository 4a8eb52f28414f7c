"""What the trials are driven with: the model's own warm-up (or sample) inputs, resized to the rows wanted."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.repository import ModelEntry, metadata_from_config
from services.gateway.tensors.types import InferInput
from services.gateway.versions.warmup import warmup_requests


def request_rows(entry: ModelEntry, version: int, config: mc.ModelConfig) -> dict[int, list[InferInput]]:
    """``rows`` -> one request of that many rows, for every power of two up to the config's max batch size and
    the max itself (just ``{1: ...}`` for a model that does not batch). Blocking: reads the warm-up files."""
    plans = warmup_requests(entry.path, version, config)
    first = plans[0].inputs
    metadata = metadata_from_config(config, (version,))
    types = {spec.name: spec.datatype for spec in metadata.inputs}
    limit = int(config.max_batch_size)
    sizes = sorted({*(2**k for k in range(limit.bit_length()) if 2**k <= limit), limit}) if limit > 0 else [1]
    found = {}
    for rows in sizes:
        inputs = []
        for name, data in first.items():
            shaped = np.ascontiguousarray(np.resize(data, (rows, *data.shape[1:]))) if limit > 0 else data
            inputs.append(InferInput(name, types[name], tuple(int(d) for d in shaped.shape), shaped))
        found[rows] = inputs
    return found
