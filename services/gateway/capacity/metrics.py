"""The model cache's metrics, registered only when the cache is on (``SWITCHYARD_MODEL_CACHE_MB``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.gateway.metrics import SWAP_BUCKETS

AGE_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "switchyard_model_cache_requests_total",
            "Requests by whether their model version was loaded: hit, miss (it was not: this request started its "
            "load), miss_waiting (it was not and a load was under way already).",
            ["result"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "switchyard_model_cache_load_seconds",
            "A load on demand from its first request to the version ready (load and warm-up): the miss latency.",
            ["model"],
            buckets=SWAP_BUCKETS,
            registry=registry,
        )
        self.evictions = Counter(
            "switchyard_model_cache_evictions_total",
            "Models unloaded by the cache, by reason: capacity (to make room), idle (SWITCHYARD_MODEL_IDLE_UNLOAD_S).",
            ["reason"],
            registry=registry,
        )
        self.age_at_eviction = Histogram(
            "switchyard_model_cache_age_at_eviction_seconds",
            "How long a model had been loaded when the cache unloaded it (short ages: churn).",
            buckets=AGE_BUCKETS,
            registry=registry,
        )
        self.resident = Gauge(
            "switchyard_model_cache_resident_bytes",
            "Memory of each loaded model (its versions together): measured, declared or estimated.",
            ["model"],
            registry=registry,
        )
        self.used = Gauge(
            "switchyard_model_cache_used_bytes", "Memory of every loaded model together.", registry=registry
        )
        self.budget = Gauge(
            "switchyard_model_cache_budget_bytes", "The model cache's budget (SWITCHYARD_MODEL_CACHE_MB).",
            registry=registry,
        )
