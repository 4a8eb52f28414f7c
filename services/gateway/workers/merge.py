"""One node's figures from its workers' own: ``/metrics`` and the statistics extension answered by any worker of
``switchyard serve --workers N`` show the node, so the worker that gets the call merges its peers' answers here.

Pure functions: they take each worker's answer (in worker order) and return the node's; asking the peers is not
their business. Counts and durations add up; settings that every worker holds alike are taken once (the largest).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from tritonclient.grpc import service_pb2

WORKER_LABEL = "worker"
"""Label each series gets in ``merge_metrics(..., per_worker=True)``: the worker's index, from 0."""

SETTING_GAUGES: frozenset[str] = frozenset({
    # The version unversioned requests go to: read from the shared routing state, so every worker reports the same
    # number; a sum (2 + 2 on two workers) would name a version that does not exist.
    "switchyard_active_version",
    # Percent of traffic sent to the canary, from the same routing record in every worker: 10% on each worker is
    # 10% of the node's traffic, not 20%.
    "switchyard_canary_weight",
    # A model's concurrency cap: it holds for the node (the workers' gates count the node's executing requests in
    # shared memory, shaping/node_share.py), so 64 on each worker is 64 for the node, not 128.
    "switchyard_admission_limit",
    # A certificate's notAfter: every worker reads the same files; a sum of two dates is no date.
    "switchyard_tls_certificate_expiry_timestamp_seconds",
})
"""Gauges whose value is a setting every worker holds alike: the node's value is the largest of theirs (equal but
for the moment a change reaches one worker before another). Every other gauge counts something each worker has
(requests in flight, waiting, executing, open streams) and is summed."""

_CREATED_OF = ("counter", "histogram", "summary")
"""Types whose series carry a ``_created`` timestamp; the 0.0.4 text writes it as a gauge family of its own
(``<name>_created``), so it is recognised by name."""

_CUMULATIVE = frozenset(_CREATED_OF)
"""The types whose figures add up over a process's life."""
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
Combine = Callable[[float, float], float]


# ----------------------------------------------------------------------------------------------------------- metrics


def merge_metrics(texts: Sequence[str], *, per_worker: bool = False, workers: Sequence[int] | None = None) -> str:
    """The node's Prometheus text exposition (format 0.0.4) from each worker's, given in worker order.

    Families keep their HELP and TYPE; samples of the same name and labels are combined: counters, histograms and
    summaries summed, ``_created`` the earliest, gauges summed except ``SETTING_GAUGES`` (the largest). A family only
    some workers have is merged all the same.

    ``per_worker=True`` gives the series a user asks for with ``/metrics?workers=each``: nothing combined, every
    sample as its worker wrote it with a ``worker="<index>"`` label added; ``workers`` names each text's worker
    (default: 0, 1, ... in order).
    """
    parsed = [list(text_string_to_metric_families(text)) for text in texts]
    indices = list(workers) if workers is not None else list(range(len(texts)))
    families = _label_each_worker(parsed, indices) if per_worker else _combine_workers(parsed)
    return generate_latest(_Families(families)).decode("utf-8")


def cumulative(text: str) -> str:
    """``text`` with only its counters, histograms and summaries: the figures that add up over a process's life (a
    gauge describes the process as it is now)."""
    families = [family for family in text_string_to_metric_families(text) if family.type in _CUMULATIVE]
    return generate_latest(_Families(families)).decode("utf-8") if families else ""


class _Families(Collector):
    """Ready families handed to prometheus_client's own writer (``generate_latest`` takes any collector)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _label_each_worker(parsed: Sequence[Sequence[Metric]], indices: Sequence[int]) -> list[Metric]:
    merged: dict[str, Metric] = {}
    for index, families in zip(indices, parsed, strict=True):
        worker = str(index)
        for family in families:
            into = _family_like(merged, family)
            for sample in family.samples:
                if WORKER_LABEL in sample.labels:
                    raise ValueError(
                        f"sample {sample.name}{sample.labels} of worker {index} already has a {WORKER_LABEL!r} label; "
                        f"expected the worker's own series, without one, to label them by worker"
                    )
                into.samples.append(sample._replace(labels={**sample.labels, WORKER_LABEL: worker}))
    return list(merged.values())


def _combine_workers(parsed: Sequence[Sequence[Metric]]) -> list[Metric]:
    created = {f"{family.name}_created" for families in parsed for family in families if family.type in _CREATED_OF}
    merged: dict[str, Metric] = {}
    values: dict[str, dict[SampleKey, Sample]] = {}
    for families in parsed:
        for family in families:
            _family_like(merged, family)
            samples = values.setdefault(family.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                earlier = samples.get(key)
                if earlier is None:
                    samples[key] = sample
                else:
                    combine = _combine_rule(family, sample.name, created)
                    samples[key] = earlier._replace(value=combine(earlier.value, sample.value))
    for name, family in merged.items():
        family.samples.extend(values[name].values())
    return list(merged.values())


def _combine_rule(family: Metric, sample_name: str, created: set[str]) -> Combine:
    if sample_name in created:
        return min  # the node's series began when its first worker's did
    if family.type == "gauge" and family.name in SETTING_GAUGES:
        return max
    return _add


def _add(a: float, b: float) -> float:
    return a + b


def _family_like(merged: dict[str, Metric], family: Metric) -> Metric:
    """The merged family of ``family``'s name, started empty (HELP and TYPE of the first worker that has it)."""
    into = merged.get(family.name)
    if into is None:
        into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
    elif into.type != family.type:
        raise ValueError(
            f"metric family {family.name} is a {into.type} in one worker and a {family.type} in another; "
            f"expected every worker to expose the same type (are the workers running different versions?)"
        )
    return into


# -------------------------------------------------------------------------------------------------------- statistics


_DURATION = service_pb2.StatisticDuration.DESCRIPTOR


def merge_statistics(answers: Sequence[Any]) -> Any:
    """The node's ``ModelStatisticsResponse`` from each worker's: ``model_stats`` combined by (name, version) in
    first-seen order; counts and durations summed, ``last_inference`` the latest.

    Only for figures each worker keeps of its own (the embedded backend). Behind Triton every worker asks the same
    Triton, whose figures are the node's already: summing them would count each request once per worker.
    """
    merged: dict[tuple[str, str], Any] = {}
    for answer in answers:
        for stats in answer.model_stats:
            key = (stats.name, stats.version)
            into = merged.get(key)
            if into is None:
                merged[key] = _copy(stats)
            else:
                _add_model_statistics(into, stats)
    return service_pb2.ModelStatisticsResponse(model_stats=list(merged.values()))


def merge_reports(reports: Sequence[Mapping[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """The node's ``ModelStatisticsResponse`` and ``gateway_stats`` from reports as the workers send them to each
    other (``{"model_stats": [...], "gateway_stats": [...]}``, the statistics messages as JSON): ``merge_statistics``
    of the former, ``merge_gateway_stats`` of the latter."""
    answers = [json_format.ParseDict({"model_stats": report["model_stats"]}, service_pb2.ModelStatisticsResponse())
               for report in reports]
    return merge_statistics(answers), merge_gateway_stats([list(report["gateway_stats"]) for report in reports])


def _copy(message: Any) -> Any:
    fresh = type(message)()
    fresh.CopyFrom(message)
    return fresh


def _add_model_statistics(into: Any, more: Any) -> None:
    into.last_inference = max(into.last_inference, more.last_inference)
    into.inference_count += more.inference_count
    into.execution_count += more.execution_count
    _add_durations(into.inference_stats, more.inference_stats)
    _add_batch_stats(into.batch_stats, more.batch_stats)
    _add_memory_usage(into.memory_usage, more.memory_usage)
    # response_stats (decoupled models): keyed by the response's index ("0", "1", ...), each worker counted the
    # responses of that index it sent; the same index from several workers adds up like any other duration.
    for index, durations in more.response_stats.items():
        _add_durations(into.response_stats[index], durations)


def _add_durations(into: Any, more: Any) -> None:
    """Every ``StatisticDuration`` field of ``more`` added to ``into``'s (the duration messages hold nothing else
    that adds up: ``InferBatchStatistics.batch_size`` is the key it is merged by)."""
    for field in more.DESCRIPTOR.fields:
        if field.message_type is _DURATION and more.HasField(field.name):
            target, extra = getattr(into, field.name), getattr(more, field.name)
            target.count += extra.count
            target.ns += extra.ns


def _add_batch_stats(into: Any, more: Iterable[Any]) -> None:
    by_size = {entry.batch_size: entry for entry in into}
    for entry in more:
        same = by_size.get(entry.batch_size)
        if same is None:
            by_size[entry.batch_size] = into.add()
            by_size[entry.batch_size].CopyFrom(entry)
        else:
            _add_durations(same, entry)


def _add_memory_usage(into: Any, more: Iterable[Any]) -> None:
    """Memory the loaded instances hold, by device (type and id): each worker loads its own instances of the model,
    so their bytes on the same device add up; a device only one worker reports is listed as it is."""
    by_device = {(entry.type, entry.id): entry for entry in into}
    for entry in more:
        same = by_device.get((entry.type, entry.id))
        if same is None:
            by_device[(entry.type, entry.id)] = into.add()
            by_device[(entry.type, entry.id)].CopyFrom(entry)
        else:
            same.byte_size += entry.byte_size


def merge_gateway_stats(answers: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The node's ``gateway_stats`` (entries as ``statistics.Hops.json`` builds them) from each worker's, combined by
    (name, version) in first-seen order, every count and ns summed.

    ``hop`` is summed like the rest: each worker's is its own success minus backend time, so their sum is the node's
    success minus backend time (a worker's hop is floored at 0, which only a clock step can make matter)."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for entries in answers:
        for entry in entries:
            key = (entry["name"], entry["version"])
            into = merged.get(key)
            if into is None:
                merged[key] = copy.deepcopy(entry)
            else:
                _add_figures(into, entry, key)
    return list(merged.values())


def _add_figures(into: dict[str, Any], more: dict[str, Any], key: tuple[str, str]) -> None:
    for field, figures in more.items():
        if field in ("name", "version"):
            continue
        if not isinstance(figures, dict):
            raise ValueError(f"gateway_stats of {key[0]} version {key[1]}: {field} is {figures!r}; "
                             f"expected a {{'count': ..., 'ns': ...}} duration")
        durations = into.setdefault(field, {"count": 0, "ns": 0})
        for name, amount in figures.items():
            durations[name] = durations.get(name, 0) + amount
