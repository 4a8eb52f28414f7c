"""The node's /metrics and statistics from its workers' own: real expositions of two workers' GatewayMetrics and
real statistics messages, merged and read back."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from tritonclient.grpc import service_pb2

from services.gateway.metrics import GatewayMetrics
from services.gateway.statistics import Hops
from services.gateway.workers.merge import merge_gateway_stats, merge_metrics, merge_statistics

Series = tuple[str, frozenset[tuple[str, str]]]


def samples(text: str) -> dict[Series, float]:
    """Every sample of an exposition by name and labels (a name and labels twice would be a merge error)."""
    found: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, f"{key} exposed twice"
            found[key] = sample.value
    return found


def series(name: str, **labels: str) -> Series:
    return name, frozenset(labels.items())


def exposition(metrics: GatewayMetrics) -> str:
    return generate_latest(metrics.registry).decode()


@pytest.fixture
def two_workers() -> tuple[GatewayMetrics, GatewayMetrics]:
    """Worker 0 and worker 1 after different traffic; the tallies' series and prometheus_client's both in use."""
    first, second = GatewayMetrics(CollectorRegistry()), GatewayMetrics(CollectorRegistry())
    for _ in range(3):
        first.served("mlp", 1, "http").ok.inc()
    first.served("mlp", 1, "http").duration.observe(0.25)
    first.served("mlp", 1, "http").duration.observe(0.5)
    first.rejected.labels("mlp", "invalid").inc()
    first.shadow_divergence.labels("mlp").observe(1e-5)
    first.inflight.labels("mlp", "1").set(2)
    first.concurrency_limit.labels("mlp").set(4)
    first.active_version.labels("mlp").set(1)
    first.canary_weight.labels("mlp").set(10)

    second.served("mlp", 1, "http").ok.inc(2)
    second.served("mlp", 1, "http").duration.observe(2.0)
    second.tenant("acme", "200").inc()  # a series worker 0 never had
    second.rejected.labels("mlp", "invalid").inc(4)
    second.shadow_divergence.labels("mlp").observe(1e-5)
    second.inflight.labels("mlp", "1").set(3)
    second.concurrency_limit.labels("mlp").set(5)
    second.active_version.labels("mlp").set(2)  # the routing change reached worker 1 first
    second.canary_weight.labels("mlp").set(10)
    return first, second


def test_one_worker_merges_to_its_own_exposition(two_workers: tuple[GatewayMetrics, GatewayMetrics]) -> None:
    text = exposition(two_workers[0])
    assert 'le="1e-05"' in text  # spellings that must round-trip are in there
    assert 'le="+Inf"' in text
    assert merge_metrics([text]) == text


def test_counters_and_histograms_of_two_workers_add_up(two_workers: tuple[GatewayMetrics, GatewayMetrics]) -> None:
    merged = samples(merge_metrics([exposition(worker) for worker in two_workers]))
    ok = {"model": "mlp", "version": "1", "protocol": "http", "code": "200"}
    assert merged[series("switchyard_requests_total", **ok)] == 5
    assert merged[series("switchyard_rejected_total", model="mlp", reason="invalid")] == 5
    assert merged[series("switchyard_tenant_requests_total", tenant="acme", code="200")] == 1
    duration = "switchyard_request_duration_seconds"
    buckets = {le: merged[series(f"{duration}_bucket", model="mlp", version="1", le=le)]
               for le in ("0.1", "0.25", "0.5", "1.0", "2.5", "+Inf")}
    assert buckets == {"0.1": 0, "0.25": 1, "0.5": 2, "1.0": 2, "2.5": 3, "+Inf": 3}
    assert merged[series(f"{duration}_count", model="mlp", version="1")] == 3
    assert merged[series(f"{duration}_sum", model="mlp", version="1")] == 2.75
    assert merged[series("switchyard_shadow_divergence_bucket", model="mlp", le="1e-05")] == 2
    assert merged[series("switchyard_shadow_divergence_bucket", model="mlp", le="1e-06")] == 0


def test_gauges_add_up_except_settings_every_worker_holds(two_workers: tuple[GatewayMetrics, GatewayMetrics]) -> None:
    merged = samples(merge_metrics([exposition(worker) for worker in two_workers]))
    assert merged[series("switchyard_inflight_requests", model="mlp", version="1")] == 5
    assert merged[series("switchyard_admission_limit", model="mlp")] == 5  # the node's cap (one saw a change first)
    assert merged[series("switchyard_active_version", model="mlp")] == 2
    assert merged[series("switchyard_canary_weight", model="mlp")] == 10


def test_created_is_the_earliest_of_the_workers() -> None:
    texts = [_exposition_of(_jobs_created_at(created)) for created in (1_000.0, 900.0, 950.0)]
    merged = samples(merge_metrics(texts))
    assert merged[series("jobs_total", kind="a")] == 6
    assert merged[series("jobs_created", kind="a")] == 900.0


def test_a_family_only_one_worker_has_is_merged(two_workers: tuple[GatewayMetrics, GatewayMetrics]) -> None:
    first, second = two_workers
    Gauge("switchyard_extra_things", "Only worker 1 has these.", ["kind"], registry=second.registry).labels("x").set(7)
    text = merge_metrics([exposition(first), exposition(second)])
    assert "# HELP switchyard_extra_things Only worker 1 has these." in text
    assert "# TYPE switchyard_extra_things gauge" in text
    assert samples(text)[series("switchyard_extra_things", kind="x")] == 7


def test_each_worker_keeps_its_series_under_a_worker_label(two_workers: tuple[GatewayMetrics, GatewayMetrics]) -> None:
    texts = [exposition(worker) for worker in two_workers]
    merged = samples(merge_metrics(texts, per_worker=True))
    expected = {
        (name, labels | {("worker", str(index))}): value
        for index, text in enumerate(texts)
        for (name, labels), value in samples(text).items()
    }
    assert merged == expected
    assert merged[series("switchyard_active_version", model="mlp", worker="0")] == 1
    assert merged[series("switchyard_active_version", model="mlp", worker="1")] == 2


def test_a_series_that_already_has_a_worker_label_is_refused() -> None:
    registry = CollectorRegistry()
    Gauge("odd", "Labelled by worker already.", ["worker"], registry=registry).labels("9").set(1)
    with pytest.raises(ValueError, match="already has a 'worker' label"):
        merge_metrics([generate_latest(registry).decode()], per_worker=True)


def test_a_family_of_two_types_is_refused() -> None:
    as_gauge, as_counter = CollectorRegistry(), CollectorRegistry()
    Gauge("things", "Things.", registry=as_gauge).set(1)
    as_counter.register(_Fixed([CounterMetricFamily("things", "Things.", value=1)]))
    with pytest.raises(ValueError, match="things is a gauge in one worker and a counter in another"):
        merge_metrics([_exposition_of(as_gauge), _exposition_of(as_counter)])


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _jobs_created_at(created: float) -> CollectorRegistry:
    """A registry whose counter began at ``created``: prometheus_client writes it, and its ``_created`` series."""
    family = CounterMetricFamily("jobs", "Jobs done.", labels=["kind"])
    family.add_metric(["a"], 2, created=created)
    registry = CollectorRegistry()
    registry.register(_Fixed([family]))
    return registry


def _exposition_of(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


# -------------------------------------------------------------------------------------------------------- statistics


def _duration(count: int, ns: int) -> service_pb2.StatisticDuration:
    return service_pb2.StatisticDuration(count=count, ns=ns)


def _model(name: str, version: str, scale: int, last: int) -> service_pb2.ModelStatistics:
    """A version's figures; ``scale`` makes each worker's numbers different."""
    stats = service_pb2.ModelStatistics(
        name=name, version=version, last_inference=last, inference_count=10 * scale, execution_count=2 * scale,
        inference_stats=service_pb2.InferStatistics(
            success=_duration(5 * scale, 1000 * scale), fail=_duration(scale, 7 * scale),
            queue=_duration(5 * scale, 100 * scale), compute_infer=_duration(5 * scale, 500 * scale),
        ),
    )
    stats.batch_stats.add(batch_size=scale, compute_infer=_duration(1, 300 * scale))
    stats.batch_stats.add(batch_size=8, compute_infer=_duration(scale, 800 * scale))
    stats.memory_usage.add(type="CPU", id=0, byte_size=1024 * scale)
    stats.response_stats["0"].success.CopyFrom(_duration(scale, 11 * scale))  # the first response: every worker
    stats.response_stats[str(scale)].cancel.CopyFrom(_duration(1, scale))
    return stats


def test_statistics_of_two_workers_add_up_by_name_and_version() -> None:
    first = service_pb2.ModelStatisticsResponse(model_stats=[_model("mlp", "1", 1, 500), _model("other", "1", 1, 5)])
    second = service_pb2.ModelStatisticsResponse(model_stats=[_model("mlp", "2", 3, 9), _model("mlp", "1", 2, 400)])
    merged = merge_statistics([first, second])
    assert [(stats.name, stats.version) for stats in merged.model_stats] == [("mlp", "1"), ("other", "1"), ("mlp", "2")]
    mlp = merged.model_stats[0]
    assert (mlp.inference_count, mlp.execution_count, mlp.last_inference) == (30, 6, 500)
    infer = mlp.inference_stats
    assert (infer.success.count, infer.success.ns, infer.fail.count, infer.fail.ns) == (15, 3000, 3, 21)
    assert (infer.queue.ns, infer.compute_infer.ns, infer.compute_input.count) == (300, 1500, 0)
    assert {b.batch_size: (b.compute_infer.count, b.compute_infer.ns) for b in mlp.batch_stats} == {
        1: (1, 300), 8: (3, 2400), 2: (1, 600)
    }
    assert [(m.type, m.id, m.byte_size) for m in mlp.memory_usage] == [("CPU", 0, 3072)]
    assert {key: (r.success.count, r.success.ns, r.cancel.count, r.cancel.ns)
            for key, r in mlp.response_stats.items()} == {"0": (3, 33, 0, 0), "1": (0, 0, 1, 1), "2": (0, 0, 1, 2)}
    assert merged.model_stats[1] == _model("other", "1", 1, 5)
    assert merged.model_stats[2] == _model("mlp", "2", 3, 9)
    assert first.model_stats[0] == _model("mlp", "1", 1, 500)  # the workers' answers are left as they came


def test_one_statistics_answer_merges_to_itself() -> None:
    answer = service_pb2.ModelStatisticsResponse(model_stats=[_model("mlp", "1", 1, 5), _model("mlp", "2", 2, 6)])
    assert merge_statistics([answer]) == answer


def test_the_merge_knows_every_field_of_the_statistics_messages() -> None:
    """Fails when a tritonclient upgrade brings a field merge_statistics does not combine yet."""
    handled = {"name", "version", "last_inference", "inference_count", "execution_count", "inference_stats",
               "batch_stats", "memory_usage", "response_stats"}
    assert {field.name for field in service_pb2.ModelStatistics.DESCRIPTOR.fields} == handled
    duration = service_pb2.StatisticDuration.DESCRIPTOR
    for message in (service_pb2.InferStatistics, service_pb2.InferBatchStatistics, service_pb2.InferResponseStatistics):
        others = {f.name for f in message.DESCRIPTOR.fields if f.message_type is not duration}
        assert others <= {"batch_size"}, f"{message.DESCRIPTOR.name} has fields that are not durations: {others}"


def test_gateway_stats_of_two_workers_add_up_by_name_and_version() -> None:
    first, second = Hops(), Hops()
    first.served("mlp", 1, 0.5, 0.25)
    first.failed("mlp", 1, 0.125)
    second.served("mlp", 1, 1.0, 0.5)
    second.served("mlp", 1, 1.0, 0.75)
    second.served("mlp", 2, 0.25, 0.125)
    answers = [[first.json("mlp", 1)], [second.json("mlp", 2), second.json("mlp", 1)]]
    merged = merge_gateway_stats(answers)
    assert merged == [
        {"name": "mlp", "version": "1", "success": {"count": 3, "ns": 2_500_000_000},
         "fail": {"count": 1, "ns": 125_000_000}, "backend": {"count": 3, "ns": 1_500_000_000},
         "hop": {"count": 3, "ns": 1_000_000_000}},
        second.json("mlp", 2),
    ]
    assert answers[0] == [first.json("mlp", 1)]  # the workers' answers are left as they came


def test_gateway_stats_that_are_not_durations_are_refused() -> None:
    entry = {"name": "mlp", "version": "1", "success": 3}
    with pytest.raises(ValueError, match="success is 3; expected a"):
        merge_gateway_stats([[entry], [entry]])
