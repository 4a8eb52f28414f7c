"""Counters and histograms for the series every request touches, read by Prometheus through a collector.

``prometheus_client``'s children take a lock per update and, for a histogram, walk its buckets in Python: a few
microseconds per request over the five series a request updates, as much as decoding it. These are plain numbers
updated from the event loop's thread only (every request path and the batcher's observer run there; so does the
``/metrics`` scrape), which needs no lock. The families keep their names, labels, buckets and exposition."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

_bound_label = cast(Callable[[float], str], floatToGoString)  # "le" written exactly as prometheus_client writes it


class Tally:
    """One counter series."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Timings:
    """One histogram series; ``counts[i]`` holds the observations in bucket ``i`` alone (the last: above them all)."""

    __slots__ = ("counts", "exemplars", "sum", "_bounds")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.exemplars: dict[int, Exemplar] | None = None
        """Per bucket, the last observation that came with exemplar labels (a recorded trace's id)."""

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        index = bisect_left(self._bounds, amount)  # first bound >= amount: Prometheus' "le"
        self.counts[index] += 1
        self.sum += amount
        if exemplar is not None:
            if self.exemplars is None:
                self.exemplars = {}
            self.exemplars[index] = Exemplar(exemplar, amount, time.time())

    def observe_times(self, amount: float, times: int) -> None:
        """``observe(amount)`` ``times`` times over (every request of a batch saw the batch's duration)."""
        self.counts[bisect_left(self._bounds, amount)] += times
        self.sum += amount * times


class CounterFamily:
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], Tally] = {}

    def labels(self, *values: str) -> Tally:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self.children[values] = Tally()
        return child

    def collect(self) -> list[Metric]:
        """As a prometheus_client collector: this family alone (the console reads a few families this way)."""
        return [self.metric()]

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self.children.items():
            family.add_metric(values, child.value)
        return family


class HistogramFamily:
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], Timings] = {}

    def labels(self, *values: str) -> Timings:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self.children[values] = Timings(self.bounds)
        return child

    def collect(self) -> list[Metric]:
        return [self.metric()]

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        names = [*(_bound_label(b) for b in self.bounds), "+Inf"]
        for values, child in self.children.items():
            total, buckets = 0, []
            exemplars = child.exemplars or {}
            for index, (name, count) in enumerate(zip(names, child.counts, strict=True)):
                total += count
                exemplar = exemplars.get(index)
                buckets.append((name, float(total)) if exemplar is None else (name, float(total), exemplar))
            family.add_metric(values, buckets, child.sum)
        return family


class Tallies(Collector):
    """The families above, registered on a registry as one collector."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._families: list[CounterFamily | HistogramFamily] = []
        registry.register(self)

    def counter(self, name: str, documentation: str, labelnames: Sequence[str]) -> CounterFamily:
        family = CounterFamily(name, documentation, labelnames)
        self._families.append(family)
        return family

    def histogram(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> HistogramFamily:
        family = HistogramFamily(name, documentation, labelnames, buckets)
        self._families.append(family)
        return family

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family.metric()

    def describe(self) -> Iterator[Metric]:
        # Called once at registration, before any family exists: the names are checked as they are collected.
        return iter(())
