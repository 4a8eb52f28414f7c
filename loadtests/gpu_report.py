"""The GPU check's figures (``gpu_check.py``): what it measured, whether it passed, written to ``gpu_check.json`` and
printed as a table. Standard library only, like the check's other sibling modules."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Parity:
    workers: int
    batch_sizes: list[int]
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    passed: bool


@dataclass(frozen=True)
class Throughput:
    workers: int
    clients: int
    client_processes: int
    requests: int
    requests_per_s: float


@dataclass
class Report:
    device: str
    environment: Any
    """The machine, as ``gpu_check.environment`` found it (a dataclass)."""
    instances: int
    seconds: float
    cache_budget_mb: float
    """The 1-worker gateway's model cache (``gpu_check.CACHE_MB``)."""
    ceiling_images_per_s: dict[int, float] = field(default_factory=dict)
    parity: list[Parity] = field(default_factory=list)
    throughput: list[Throughput] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    cache_charged_mb: float | None = None
    """What the 1-worker gateway's model cache charged the classifier."""

    @property
    def passed(self) -> bool:
        return not self.failures and bool(self.parity) and all(p.passed for p in self.parity)

    def write(self, out: Path) -> None:
        """``gpu_check.json`` in ``out``: every figure, and whether the check passed."""
        out.mkdir(parents=True, exist_ok=True)
        figures = asdict(self) | {"passed": self.passed}
        (out / "gpu_check.json").write_text(json.dumps(figures, indent=2) + "\n")

    def print_table(self, out: Path) -> None:
        best = max(self.ceiling_images_per_s.values(), default=0.0)
        print(f"\nGPU check ({self.device}, {self.instances} instance(s) per worker, {self.seconds:g} s per run)")
        print(f"{'what':<34}{'figure':>12}  unit")
        for batch, rate in self.ceiling_images_per_s.items():
            print(f"{f'in-process, batch {batch}':<34}{rate:>12.0f}  images/s")
        for run in self.throughput:
            share = f"  ({run.requests_per_s / best:.1%} of the best in-process)" if best else ""
            label = f"gateway, {run.workers} worker(s), {run.clients} clients"
            print(f"{label:<34}{run.requests_per_s:>12.0f}  req/s{share}")
        if self.cache_charged_mb is not None:
            print(f"{'model cache charge, 1 worker':<34}{self.cache_charged_mb:>12.1f}  MiB (of "
                  f"{self.cache_budget_mb:g}; the runtime's start charged to no model)")
        for checked in self.parity:
            print(f"parity with {checked.workers} worker(s): {'ok' if checked.passed else 'FAILED'} "
                  f"(max abs {checked.max_abs_error:.3g}, max rel {checked.max_rel_error:.3g})")
        for failure in self.failures:
            print(f"FAILED: {failure}")
        print(f"{'passed' if self.passed else 'FAILED'}; figures in {out / 'gpu_check.json'}", flush=True)
