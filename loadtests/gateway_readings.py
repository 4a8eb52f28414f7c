"""What a load test reads of a gateway it started, from outside: its ``/metrics`` (counters by label, histograms
with the buckets their quantiles fall in) and its process's resident memory, sampled on a thread of its own."""

from __future__ import annotations

import math
import os
import threading
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20
SAMPLE_S = 0.1
Samples = dict[str, list[tuple[str, dict[str, str], float]]]
"""Every sample of a /metrics answer by family name: (sample name, labels, value)."""


@dataclass
class Histogram:
    count: float
    total: float
    buckets: list[tuple[float, float]]
    """(upper bound, cumulative count), ascending, +Inf last."""

    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def quantile(self, q: float) -> str:
        """The bucket the ``q`` quantile falls in: the buckets are wide (0.25-0.5-1-2.5 s), and a value
        interpolated inside one would claim a precision the histogram does not have."""
        if not self.count:
            return "n/a"
        lower = 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= q * self.count:
                return f"> {lower:g} s" if math.isinf(bound) else f"{lower:g}-{bound:g} s"
            lower = bound
        return "n/a"

    def spread(self) -> str:
        """How many observations fell in each bucket, the empty ones left out."""
        parts, lower, below = [], 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative > below:
                upper = f"> {lower:g}" if math.isinf(bound) else f"{lower:g}-{bound:g}"
                parts.append(f"{cumulative - below:.0f} at {upper} s")
            lower, below = bound, cumulative
        return ", ".join(parts) or "none"


def scrape(url: str) -> Samples:
    """Every sample of the gateway's /metrics by family name: (sample name, labels, value)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {family.name: [(s.name, s.labels, s.value) for s in family.samples]
            for family in text_string_to_metric_families(text)}


def by_label(metrics: Samples, family: str,
             label: str) -> defaultdict[str, float]:
    """A counter's value by one label (its ``_total`` samples; not ``_created``)."""
    found: defaultdict[str, float] = defaultdict(float)
    for name, labels, value in metrics.get(family, []):
        if name.endswith("_total") or name == family:
            found[labels.get(label, "")] += value
    return found


def histogram(metrics: Samples, family: str,
              model: str | None = None) -> Histogram:
    """The family's histogram, its series added up (or only ``model``'s)."""
    count, total = 0.0, 0.0
    buckets: defaultdict[float, float] = defaultdict(float)
    for name, labels, value in metrics.get(family, []):
        if model is not None and labels.get("model") != model:
            continue
        if name.endswith("_count"):
            count += value
        elif name.endswith("_sum"):
            total += value
        elif name.endswith("_bucket"):
            buckets[float(labels["le"])] += value
    return Histogram(count, total, sorted(buckets.items()))


class MemorySampler:
    """The process's resident memory (``/proc/PID/statm``) every ``SAMPLE_S``, from a thread of its own: the
    event loop driving the clients may be busy when a sample is due."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def resident_mib(self) -> float:
        with open(f"/proc/{self.pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE / MIB

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                self.samples.append(self.resident_mib())
            except OSError:
                return

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
