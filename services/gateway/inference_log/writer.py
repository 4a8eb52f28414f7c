"""The inference log's writer: the request path offers exchanges without ever waiting, one background thread turns
them into records and hands them to the sink in batches.

Serving comes first: a full queue drops the exchange (counted), a sink that fails drops its batch (counted, logged
at most once per ``LOG_EVERY_S``) and the next batch tries again. Memory is bounded by the queue alone."""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from services.gateway.inference_log.records import NO_REDACTION, Exchange, LogPolicy, build_record
from services.gateway.inference_log.sinks import Sink

log = logging.getLogger(__name__)

BATCH_MAX: Final = 256
LOG_EVERY_S: Final = 10.0
DROP_REASONS: Final = ("queue_full", "sink_error", "encode_error")


class _Stop:
    """Put on the queue by ``close``: everything offered before it is written first."""


_STOP: Final = _Stop()


class InferenceLogMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter(
            "switchyard_inference_log_records_total",
            "Inference-log records the sink accepted.",
            registry=registry,
        )
        self.dropped = Counter(
            "switchyard_inference_log_dropped_total",
            "Sampled exchanges that never reached the inference log, by reason: queue_full (the writer fell "
            "behind), sink_error (the sink refused their batch), encode_error (no record could be built).",
            ["reason"],
            registry=registry,
        )
        for reason in DROP_REASONS:
            self.dropped.labels(reason)  # every reason shows from the start, at 0
        self.queued = Gauge(
            "switchyard_inference_log_queue",
            "Exchanges waiting for the inference log's writer.",
            registry=registry,
        )


class _ThrottledWarning:
    """Counts failures of one kind and logs them at most once per ``LOG_EVERY_S``: a sink that is down for an hour
    writes a few hundred lines, each with how many records it cost since the last one."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._unreported = 0
        self._last_logged: float | None = None

    def failed(self, count: int, cause: BaseException) -> None:
        self._unreported += count
        now = time.monotonic()
        if self._last_logged is not None and now - self._last_logged < LOG_EVERY_S:
            return
        log.warning("inference log: %d %s dropped since the last report: %s: %s",
                    self._unreported, self.what, type(cause).__name__, cause)
        self._unreported = 0
        self._last_logged = now


class InferenceLog:
    def __init__(
        self,
        sink: Sink,
        *,
        sample: float,
        policy: Callable[[str], LogPolicy | None],
        queue_size: int,
        max_record_bytes: int,
        registry: CollectorRegistry | None = None,
        default_priority: int | None = None,
    ) -> None:
        """``policy`` gives a model's own settings (or ``None``); it is called on the request path by ``wants`` and
        on the writer's thread, so it must be a cheap, thread-safe lookup. ``default_priority``: the rank of a request
        that names none, which its record leaves out."""
        _check_rate(sample, "the inference log's sample rate")
        if queue_size < 1 or max_record_bytes < 1:
            raise ValueError(f"the inference log needs queue_size >= 1 and max_record_bytes >= 1, "
                             f"got queue_size={queue_size}, max_record_bytes={max_record_bytes}")
        self.sink = sink
        self.sample = sample
        self.max_record_bytes = max_record_bytes
        self._default_priority = default_priority
        self._policy = policy
        self._queue: queue.Queue[Exchange | _Stop] = queue.Queue(maxsize=queue_size)
        self.metrics = InferenceLogMetrics(registry if registry is not None else REGISTRY)
        self.metrics.queued.set_function(self._queue.qsize)  # read at scrape time: offer() updates nothing
        self._sink_failures = _ThrottledWarning("records (sink failed)")
        self._encode_failures = _ThrottledWarning("records (could not be encoded)")
        self._thread: threading.Thread | None = None
        self._closed = False
        self._abandon = threading.Event()

    def wants(self, model: str) -> bool:
        """Whether to log this request of ``model``: its own rate when its policy sets one, else the global one."""
        policy = self._policy(model)
        rate = policy.sample if policy is not None and policy.sample is not None else self.sample
        if rate >= 1.0:
            return True
        if rate <= 0.0:
            return False
        return random.random() < rate

    def offer(self, exchange: Exchange) -> None:
        """Queue the exchange for the writer; never waits: when the queue is full it is dropped and counted.
        After ``close`` it is ignored (the gateway has stopped serving)."""
        if self._closed:
            return
        try:
            self._queue.put_nowait(exchange)
        except queue.Full:
            self.metrics.dropped.labels("queue_full").inc()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="inference-log-writer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float) -> None:
        """Write what is queued, for at most ``timeout_s``, then close the sink. What a stuck sink leaves queued is
        logged as lost; the writer's daemon thread then stops at its next batch."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        thread = self._thread
        if thread is not None:
            with contextlib.suppress(queue.Full):  # the sink is stuck: the join below times out too
                self._queue.put(_STOP, timeout=max(0.0, timeout_s))
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._abandon.set()
                log.warning("inference log: the sink did not take the queued records within %.1f s; "
                            "%d exchanges queued are not written", timeout_s, self._queue.qsize())
                return  # the thread still uses the sink; closing it under the thread would break its write
        self.sink.close()

    def _run(self) -> None:
        while not self._abandon.is_set():
            batch, stop = self._take_batch()
            if batch:
                self._write(batch)
            if stop:
                return

    def _take_batch(self) -> tuple[list[Exchange], bool]:
        """Waits for one exchange, then takes what else is queued, up to ``BATCH_MAX``; ``True`` when the stop
        marker came with them."""
        batch: list[Exchange] = []
        item = self._queue.get()
        while True:
            if isinstance(item, _Stop):
                return batch, True
            batch.append(item)
            if len(batch) >= BATCH_MAX:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False

    def _write(self, batch: list[Exchange]) -> None:
        records = [record for record in map(self._record, batch) if record is not None]
        if not records:
            return
        try:
            self.sink.write(records)
        except Exception as error:  # whatever the sink raises, the thread must live on for the next batch
            self.metrics.dropped.labels("sink_error").inc(len(records))
            self._sink_failures.failed(len(records), error)
            return
        self.metrics.written.inc(len(records))

    def _record(self, exchange: Exchange) -> dict[str, Any] | None:
        try:
            policy = self._policy(exchange.request.model)
            redact = policy.redact if policy is not None else NO_REDACTION
            return build_record(
                exchange, redact=redact, max_bytes=self.max_record_bytes, default_priority=self._default_priority
            )
        except Exception as error:  # one exchange that cannot be encoded must not cost the rest of the batch
            self.metrics.dropped.labels("encode_error").inc()
            self._encode_failures.failed(1, error)
            return None


def _check_rate(rate: float, what: str) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{what} must be between 0 and 1, got {rate}")
