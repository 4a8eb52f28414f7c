"""Metric names a dashboard may use (the gateway's, from ``GatewayMetrics`` itself, and Triton's documented ``nv_*``
names) and the metric names a PromQL expression refers to."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from services.gateway.metrics import GatewayMetrics

TRITON_METRICS = frozenset({
    # Triton's docs/user_guide/metrics.md: inference request counts and cumulative latencies (per model and version).
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_pending_request_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    # GPU and CPU metrics (per interval).
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "nv_energy_consumption",
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
})

PROMETHEUS_SERIES = frozenset({"up"})
"""Series Prometheus writes itself for every target it scrapes: an alert may use them, no exporter declares them."""

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def gateway_metrics() -> frozenset[str]:
    """Every series name the gateway can expose, read from a fresh ``GatewayMetrics`` rather than a second list."""
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    return frozenset(family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type])


def exposition_names(text: str) -> set[str]:
    """Series names a /metrics answer declares: every family's names by its type (a labelled family with no child yet
    has HELP/TYPE lines but no sample) and every sample's."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                      "offset", "inf", "nan"})
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expression: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label names or strings."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expression)  # label values and function string arguments
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors and subqueries
    text = LABEL_LISTS.sub("", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        follows = text[match.end() :].lstrip()[:1]
        before = text[: match.start()].rstrip()[-1:]
        if follows == "(" or match.group() in KEYWORDS or before.isdigit() or before == ".":
            continue
        names.add(match.group())
    return names


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expression) for every panel target (rows' nested panels too) and every annotation query."""
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            yield f"annotation {annotation['name']!r}", annotation["expr"]


GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
"""Grafana substitutes these before the query reaches Prometheus; promtool needs a duration in their place."""


def as_prometheus_sees_it(expression: str) -> str:
    for variable, duration in GRAFANA_INTERVALS.items():
        expression = expression.replace(variable, duration)
    return expression
