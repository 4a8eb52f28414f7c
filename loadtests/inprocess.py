"""The floor the gateway is measured against: onnxruntime called in this process, with no server between."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from result import Result
from workload import MODELS


def run_inprocess(model: str, path: Path, batch: int, threads: int, duration: float, warmup: float) -> Result:
    """The gateway's own session options (intra-op threads, no spinning) called in a tight loop."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name, shape = MODELS[model]
    data = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
    latencies: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < warmup:
        session.run(None, {name: data})
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < duration:
        session.run(None, {name: data})
        latencies.append((time.perf_counter() - now) * 1e3)
    return Result(model, f"in-process b{batch}", batch, len(latencies), time.perf_counter() - start, latencies, batch)
