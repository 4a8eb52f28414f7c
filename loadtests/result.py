"""One measured run (model, mode, client count) and the figures the reports read from it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Result:
    model: str
    mode: str
    concurrency: int
    requests: int
    seconds: float
    latencies_ms: list[float]
    rows_per_request: int = 1
    cpu_ms: float | None = None
    """CPU milliseconds the server process spent per request over the run (None: not measured)."""
    round: int = 0
    """Which round of a bench that repeats a level (-1: a run outside the rounds, paired with none)."""

    @property
    def throughput(self) -> float:
        """Rows (samples) per second."""
        return self.requests * self.rows_per_request / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")
