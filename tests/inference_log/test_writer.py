"""The writer: sampling, every offered exchange written, a stuck sink never holding the request path up, a failing
sink or a broken exchange costing only what it must."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from services.gateway.inference_log.records import Exchange, LogPolicy
from services.gateway.inference_log.sinks import JsonLinesSink
from services.gateway.inference_log.writer import InferenceLog
from services.gateway.tensors.types import InferInput, InferOutput, InferRequest, InferResponse

DROPPED = "switchyard_inference_log_dropped_total"


def _exchange(index: int, model: str = "mlp") -> Exchange:
    values = np.array([[index, index + 1]], np.int64)
    return Exchange(
        request=InferRequest(model=model, version=None, inputs=[InferInput("IN", "INT64", (1, 2), values)]),
        response=InferResponse(model, 1, [InferOutput("OUT", "INT64", values * 2)]),
        status=200, error=None, version=1, route="stable", protocol="grpc", arrived=time.time(), latency_s=0.001,
        request_id=f"req-{index}", trace_id=None,
    )


def _no_policy(model: str) -> LogPolicy | None:
    return None


def _log(sink: Any, registry: CollectorRegistry, *, queue_size: int = 2000, sample: float = 1.0,
         policy: Callable[[str], LogPolicy | None] = _no_policy) -> InferenceLog:
    return InferenceLog(sink, sample=sample, policy=policy, queue_size=queue_size, max_record_bytes=1 << 16,
                        registry=registry)


def _metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not registered"
    return value


def _wait_until(condition: Callable[[], bool]) -> None:
    """For the writer's thread to get somewhere; fails (never hangs) when it does not."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the writer's thread did not get there within 10 s"
        time.sleep(0.002)


class _HeldSink:
    """A sink whose write waits until released (a stuck network), remembering how many records it was given."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.written = 0

    def write(self, records: list[dict[str, Any]]) -> None:
        self.entered.set()
        self.release.wait(30)
        self.written += len(records)

    def close(self) -> None:
        pass


class _FailingSink:
    """Refuses its first ``failures`` batches, then keeps what it gets."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.records: list[dict[str, Any]] = []

    def write(self, records: list[dict[str, Any]]) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("redis is down")
        self.records.extend(records)

    def close(self) -> None:
        pass


def test_every_offered_exchange_becomes_a_record(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    sink = JsonLinesSink(tmp_path, max_bytes=1 << 20, count=100)
    writer = _log(sink, registry)
    writer.start()
    for index in range(1000):
        if writer.wants("mlp"):
            writer.offer(_exchange(index))
    writer.close(timeout_s=30)

    lines = [orjson.loads(line) for path in sink.files() for line in path.read_bytes().splitlines()]
    assert [record["id"] for record in lines] == [f"req-{index}" for index in range(1000)]
    assert _metric(registry, "switchyard_inference_log_records_total") == 1000
    assert _metric(registry, DROPPED, reason="queue_full") == 0
    assert _metric(registry, "switchyard_inference_log_queue") == 0


def test_sampling_follows_the_global_rate_unless_the_model_sets_its_own() -> None:
    policies = {"always": LogPolicy(sample=1.0), "never": LogPolicy(sample=0.0), "default": LogPolicy()}
    silent = _log(_FailingSink(0), CollectorRegistry(), sample=0.0, policy=policies.get)
    assert [silent.wants(model) for model in ("mlp", "default", "always", "never")] == [False, False, True, False]
    loud = _log(_FailingSink(0), CollectorRegistry(), sample=1.0, policy=policies.get)
    assert [loud.wants(model) for model in ("mlp", "default", "always", "never")] == [True, True, True, False]

    random.seed(35)
    half = _log(_FailingSink(0), CollectorRegistry(), sample=0.25, policy=policies.get)
    assert 2000 < sum(half.wants("mlp") for _ in range(10_000)) < 3000


def test_a_stuck_sink_never_holds_up_an_offer(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    sink = _HeldSink()
    writer = _log(sink, registry, queue_size=8)
    writer.start()
    writer.offer(_exchange(0))
    assert sink.entered.wait(10)  # the thread holds exchange 0 in the stuck write; the queue is empty

    offered = 0
    for index in range(1, 101):
        writer.offer(_exchange(index))  # returns although nothing drains the queue
        offered += 1
    assert offered == 100
    assert _metric(registry, "switchyard_inference_log_queue") == 8
    assert _metric(registry, DROPPED, reason="queue_full") == 92

    sink.release.set()
    writer.close(timeout_s=30)
    assert sink.written == 1 + 8
    assert _metric(registry, "switchyard_inference_log_records_total") == 9


def test_close_gives_up_on_a_stuck_sink_after_its_timeout() -> None:
    sink = _HeldSink()
    writer = _log(sink, CollectorRegistry(), queue_size=4)
    writer.start()
    writer.offer(_exchange(0))
    assert sink.entered.wait(10)
    for index in range(1, 5):
        writer.offer(_exchange(index))
    writer.close(timeout_s=0.05)  # returns: the queue stays full and the write stays stuck
    assert sink.written == 0
    sink.release.set()


def test_a_failing_sink_drops_its_batch_and_the_writer_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    sink = _FailingSink(failures=3)
    writer = _log(sink, registry)
    writer.start()
    with caplog.at_level(logging.WARNING, logger="services.gateway.inference_log.writer"):
        for index in range(3):  # one at a time, so that each is a batch of its own and fails
            writer.offer(_exchange(index))
            _wait_until(lambda: _metric(registry, DROPPED, reason="sink_error") == index + 1)  # noqa: B023
        for index in range(3, 8):
            writer.offer(_exchange(index))
        writer.close(timeout_s=30)

    assert [record["id"] for record in sink.records] == [f"req-{index}" for index in range(3, 8)]
    assert _metric(registry, "switchyard_inference_log_records_total") == 5
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == ["inference log: 1 records (sink failed) dropped since the last report: "
                        "ConnectionError: redis is down"]  # the next two fall within the 10 s


def test_an_exchange_that_cannot_be_encoded_costs_only_itself() -> None:
    registry = CollectorRegistry()
    sink = _FailingSink(failures=0)
    writer = _log(sink, registry)
    broken = _exchange(1)
    broken.request.inputs[0] = InferInput("IN", "FP32", (1,), np.array([object()], dtype=np.object_))
    for exchange in (_exchange(0), broken, _exchange(2)):
        writer.offer(exchange)
    writer.start()  # after the offers: the three are one batch
    writer.close(timeout_s=30)

    assert [record["id"] for record in sink.records] == ["req-0", "req-2"]
    assert _metric(registry, DROPPED, reason="encode_error") == 1


def test_the_redaction_of_the_models_policy_applies(tmp_path: Path) -> None:
    policy = LogPolicy(redact={"IN": "drop"})
    sink = _FailingSink(failures=0)

    def private_only(model: str) -> LogPolicy | None:
        return policy if model == "private" else None

    writer = _log(sink, CollectorRegistry(), policy=private_only)
    writer.offer(_exchange(0, model="private"))
    writer.offer(_exchange(1, model="public"))
    writer.start()
    writer.close(timeout_s=30)
    assert [(record["redacted"], len(record["request"]["inputs"])) for record in sink.records] == [(["IN"], 0),
                                                                                                   ([], 1)]
