"""Prometheus metrics (``switchyard_*``, names fixed by docs/architecture.md, "Metrics"), registered on a registry
passed in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.gateway.tallies import Tallies

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SWAP_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
DIVERGENCE_BUCKETS = (0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
RESPONSE_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
OTHER = "_other"
"""Label value of a model or version the repository does not know: made-up names share one series."""


@dataclass(frozen=True, slots=True)
class ServedSeries:
    """The labelled series every successful request of one model version and protocol touches."""

    ok: Any
    duration: Any


SWITCH_RESULTS = ("ok", "failed", "unchanged")
ROLLBACK_REASONS = ("error_rate", "p99_ratio")
REJECT_REASONS = (
    "too_large", "unauthorized", "forbidden", "rate_limit", "key_flood", "key_concurrency", "invalid", "not_found",
    "deadline", "overload",
)
"""Every value the labels below take: a routed model's series exist at 0 from the start (``known_model``)."""


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._known: set[str] = set()
        self._served: dict[tuple[str, int, str], ServedSeries] = {}
        self._backend: dict[tuple[str, str], Any] = {}
        self._tenants: dict[tuple[str, str], Any] = {}
        hot = Tallies(registry)  # the series each request updates: lock-free (see tallies.py)
        self.requests = hot.counter(
            "switchyard_requests_total",
            "Inference requests by outcome; code is the HTTP status (gRPC answers map to the same codes).",
            ["model", "version", "protocol", "code"],
        )
        self.request_duration = hot.histogram(
            "switchyard_request_duration_seconds",
            "Time from a decoded request to its response, inside the gateway.",
            ["model", "version"],
            LATENCY_BUCKETS,
        )
        self.backend_duration = hot.histogram(
            "switchyard_backend_duration_seconds",
            "Time the backend spent executing the (batched) request.",
            ["model", "version"],
            LATENCY_BUCKETS,
        )
        self.queue_wait = hot.histogram(
            "switchyard_queue_wait_seconds",
            "Time a request waited in the dynamic batcher's queue.",
            ["model"],
            LATENCY_BUCKETS,
        )
        self.inflight = Gauge(
            "switchyard_inflight_requests",
            "Requests being served, by the version they hold a lease on (a swap drains these before unloading).",
            ["model", "version"],
            registry=registry,
        )
        self.tenant_requests = hot.counter(
            "switchyard_tenant_requests_total",
            "Inference requests by API-key tenant (\"anonymous\" without keys) and HTTP status code.",
            ["tenant", "code"],
        )
        self.queued = Gauge(
            "switchyard_admission_waiting",
            "Requests waiting for a concurrency slot of the model.",
            ["model"],
            registry=registry,
        )
        self.executing = Gauge(
            "switchyard_admission_executing",
            "Requests of the model past its concurrency gate (executing or in the backend's own queue).",
            ["model"],
            registry=registry,
        )
        self.concurrency_limit = Gauge(
            "switchyard_admission_limit",
            "Requests the model may execute at once (moves when the limit is adaptive).",
            ["model"],
            registry=registry,
        )
        self.rejected = Counter(
            "switchyard_rejected_total",
            "Requests turned away by the gateway before reaching a model, by reason: too_large, unauthorized, "
            "forbidden, rate_limit, key_flood (too many new API keys to verify), key_concurrency, invalid, not_found, "
            "deadline, overload.",
            ["model", "reason"],
            registry=registry,
        )
        self.key_rejected = Counter(
            "switchyard_api_key_rejected_total",
            "Requests of a keys-file API key turned away for the key's sake, by key id and reason: unauthorized "
            "(a wrong or expired secret for the id), forbidden (a model outside its list), rate_limit, "
            "key_concurrency. Ids come from the keys file only; never a secret.",
            ["key", "reason"],
            registry=registry,
        )
        self.batch_size = hot.histogram(
            "switchyard_batch_size",
            "Rows per executed batch (embedded backend); its count is the number of executions.",
            ["model"],
            BATCH_BUCKETS,
        )
        self.active_version = Gauge(
            "switchyard_active_version",
            "The version unversioned requests are routed to.",
            ["model"],
            registry=registry,
        )
        self.version_switches = Counter(
            "switchyard_version_switches_total",
            "Hot version switches (activate, rollback) by result: ok, failed, unchanged.",
            ["model", "result"],
            registry=registry,
        )
        self.canary_rollbacks = Counter(
            "switchyard_canary_rollbacks_total",
            "Canaries the gateway pulled back by itself, by the bound they broke (error_rate, p99_ratio).",
            ["model", "reason"],
            registry=registry,
        )
        self.canary_weight = Gauge(
            "switchyard_canary_weight",
            "Percent of unversioned requests sent to the canary version (0: no split).",
            ["model"],
            registry=registry,
        )
        self.shadow_requests = Counter(
            "switchyard_shadow_requests_total",
            "Shadow requests by result: ok, failed, dropped (too many in flight), unavailable (not loaded).",
            ["model", "result"],
            registry=registry,
        )
        self.shadow_divergence = Histogram(
            "switchyard_shadow_divergence",
            "Largest absolute difference between the served answer and the shadow version's, per request.",
            ["model"],
            buckets=DIVERGENCE_BUCKETS,
            registry=registry,
        )
        self.shadow_argmax_disagreements = Counter(
            "switchyard_shadow_argmax_disagreements_total",
            "Rows of classifier-like outputs where the shadow version picked another argmax.",
            ["model"],
            registry=registry,
        )
        self.invented_warmup_failures = Counter(
            "switchyard_invented_warmup_failures_total",
            "Warm-ups the gateway invented (no manifest samples, no model_warmup) that failed; the version serves "
            "anyway, as Triton would serve it without a warm-up, and the repository index notes why.",
            ["model"],
            registry=registry,
        )
        self.open_streams = Gauge(
            "switchyard_open_streams",
            "Streams open now (gRPC ModelStreamInfer, HTTP generate_stream).",
            ["protocol"],
            registry=registry,
        )
        self.stream_responses = Histogram(
            "switchyard_stream_responses",
            "Responses per streamed request (1 unless the model is decoupled).",
            ["model"],
            buckets=RESPONSE_COUNT_BUCKETS,
            registry=registry,
        )
        self.first_response = Histogram(
            "switchyard_time_to_first_response_seconds",
            "Time from a streamed request's decoding to its first response.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.model_instances = Gauge(
            "switchyard_model_instances",
            "Instances of each loaded version of the embedded backend, by device (cpu, cuda:N); fallback=cpu when a "
            "KIND_GPU group runs on the CPU because SWITCHYARD_GPU_FALLBACK=cpu said so.",
            ["model", "version", "device", "fallback"],
            registry=registry,
        )
        self.tls_certificate_expiry = Gauge(
            "switchyard_tls_certificate_expiry_timestamp_seconds",
            "notAfter (unix time) of each certificate in use: the one the listeners present (setting tls_cert_file), "
            "the client CAs (tls_client_ca_file), and the client certificate and CAs of the TLS to Triton.",
            ["setting", "subject", "serial"],
            registry=registry,
        )
        self.swap_step = Histogram(
            "switchyard_swap_step_seconds",
            "Duration of each step of a version action (load, warmup, compare, flip, drain, unload).",
            ["model", "step"],
            buckets=SWAP_BUCKETS,
            registry=registry,
        )

    def known_model(self, model: str) -> None:
        """Create the model's event counters at 0 (switches, canary rollbacks, rejections): a series born at its first
        event reads as 1 in its first sample, and Prometheus's ``increase()`` sees no increase in it, so the first
        switch, rollback or refusal of each kind after a start never showed on a dashboard or fired an alert."""
        if model in self._known:
            return
        self._known.add(model)
        for result in SWITCH_RESULTS:
            self.version_switches.labels(model, result)
        for reason in ROLLBACK_REASONS:
            self.canary_rollbacks.labels(model, reason)
        for reason in REJECT_REASONS:
            self.rejected.labels(model, reason)

    def served(self, model: str, version: int, protocol: str) -> ServedSeries:
        """Looked up once per model version and protocol."""
        key = (model, version, protocol)
        series = self._served.get(key)
        if series is None:
            label = str(version)
            series = self._served[key] = ServedSeries(
                ok=self.requests.labels(model, label, protocol, "200"),
                duration=self.request_duration.labels(model, label),
            )
        return series

    def backend_time(self, model: str, version: str) -> Any:
        """``backend_duration`` of one model version, looked up once."""
        child = self._backend.get((model, version))
        if child is None:
            child = self._backend[(model, version)] = self.backend_duration.labels(model, version)
        return child

    def tenant(self, tenant: str, code: str) -> Any:
        """``tenant_requests`` of one tenant and status, looked up once (tenants come from the API keys)."""
        key = (tenant, code)
        child = self._tenants.get(key)
        if child is None:
            child = self._tenants[key] = self.tenant_requests.labels(tenant, code)
        return child
