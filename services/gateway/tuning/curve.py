"""Before any trial: one instance, no batcher, one client; the median latency of a request of each batch size."""

from __future__ import annotations

import statistics
import time

from services.gateway.tensors.types import InferInput
from services.gateway.tuning.hosts import TrialHost

REPEATS = 15
SIZE_BUDGET_S = 0.4
"""At most this long per batch size (a slow model gets fewer repeats)."""


async def measure_curve(
    host: TrialHost, name: str, version: int, requests: dict[int, list[InferInput]]
) -> dict[int, float]:
    """Batch size -> median milliseconds, from a trial already loaded unbatched under ``name``."""
    for _ in range(3):  # first runs pay for lazy initialisation
        await host.infer(name, version, requests[min(requests)])
    curve = {}
    for rows, inputs in sorted(requests.items()):
        took: list[float] = []
        until = time.perf_counter() + SIZE_BUDGET_S
        while len(took) < REPEATS and (len(took) < 3 or time.perf_counter() < until):
            began = time.perf_counter()
            await host.infer(name, version, inputs)
            took.append((time.perf_counter() - began) * 1e3)
        curve[rows] = statistics.median(took)
    return curve
