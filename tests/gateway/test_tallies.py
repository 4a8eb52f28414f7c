"""Tallies expose exactly what prometheus_client's Counter and Histogram expose for the same observations."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from services.gateway.tallies import Tallies

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 1.0, 10.0)
VALUES = (0.0, 0.0005, 0.0007, 0.001, 0.003, 0.5, 2.0, 20.0, 1e9)


def exposition(registry: CollectorRegistry) -> list[str]:
    """The text format without the ``_created`` series (prometheus_client's own timestamps)."""
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_tallies_expose_the_same_text_as_prometheus_client_when_fed_the_same_values() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counter = Counter("x_requests_total", "Requests.", ["model", "code"], registry=theirs)
    histogram = Histogram("x_seconds", "Seconds.", ["model"], buckets=BUCKETS, registry=theirs)
    tallies = Tallies(ours)
    our_counter = tallies.counter("x_requests_total", "Requests.", ["model", "code"])
    our_histogram = tallies.histogram("x_seconds", "Seconds.", ["model"], BUCKETS)
    for i, value in enumerate(VALUES):
        for family in (counter, our_counter):
            family.labels("m", str(200 + i % 2)).inc()
            family.labels("n", "500").inc(2.5)
        for family in (histogram, our_histogram):  # type: ignore[assignment]
            family.labels("m").observe(value)
    assert exposition(ours) == exposition(theirs)


def test_tallies_refuse_wrong_label_count_when_asked_for_a_series() -> None:
    family = Tallies(CollectorRegistry()).counter("y_total", "Y.", ["a", "b"])
    with pytest.raises(ValueError, match=r"takes labels \('a', 'b'\)"):
        family.labels("only-one")


def test_observe_times_matches_repeated_observations_when_a_batch_shares_a_duration() -> None:
    from services.gateway.tallies import Timings

    bounds = (0.001, 0.01, 0.1)
    once, repeated = Timings(bounds), Timings(bounds)
    once.observe_times(0.005, 3)
    for _ in range(3):
        repeated.observe(0.005)
    assert (once.counts, once.sum) == (repeated.counts, repeated.sum)
    assert once.counts == [0, 3, 0, 0]
