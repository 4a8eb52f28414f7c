"""GPU gauges from NVML: none (and one line saying why) without the module, the driver or a device; the values a
device reports otherwise, read at scrape time. NVML itself needs a GPU, so the devices here are a tiny stand-in for
the ``pynvml`` module handed to the collector's constructor; the missing module is the real one."""

from __future__ import annotations

import importlib.util
import logging
from types import SimpleNamespace
from typing import Any

import onnxruntime as ort
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from scripted_backend import ScriptedBackend

from services.gateway.app import create_app
from services.gateway.backends.nvml import (
    MEMORY_TOTAL,
    MEMORY_USED,
    UTILIZATION,
    GpuCollector,
    gpu_install_report,
    register_gpu_metrics,
)
from services.gateway.settings import Settings

GIB = 1 << 30


class FakeNvmlError(Exception):
    """What pynvml raises (``NVMLError``) when a call fails."""


class FakeNvml:
    """The five pynvml calls the collector makes, over devices given as (used, total, utilisation %) or an
    exception to raise for the utilisation."""

    def __init__(self, devices: list[tuple[int, int, int | Exception]], init_error: Exception | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.memory_reads = 0

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        if self.init_error is not None:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802
        self.memory_reads += 1
        used, total, _ = self.devices[handle]
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        rate = self.devices[handle][2]
        if isinstance(rate, Exception):
            raise rate
        return SimpleNamespace(gpu=rate, memory=0)


def gpu_lines(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "switchyard_gpu_" in line]


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="pynvml is installed here")
def test_gpu_metrics_absent_without_pynvml_when_registered(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    with caplog.at_level(logging.INFO, logger="services.gateway.backends.nvml"):
        collector = register_gpu_metrics(registry)
    assert "pynvml" in collector.why_not
    assert "nvidia-ml-py" in collector.why_not
    assert gpu_lines(registry) == []
    assert [r.getMessage() for r in caplog.records] == [f"no GPU metrics: {collector.why_not}"]


def test_gpu_metrics_absent_when_nvml_init_fails_when_registered(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    nvml = FakeNvml([(1, 2, 3)], init_error=FakeNvmlError("Driver Not Loaded"))
    with caplog.at_level(logging.INFO, logger="services.gateway.backends.nvml"):
        collector = register_gpu_metrics(registry, nvml)
    assert "NVML did not start (FakeNvmlError: Driver Not Loaded)" in collector.why_not
    assert gpu_lines(registry) == []
    assert [r.getMessage() for r in caplog.records] == [f"no GPU metrics: {collector.why_not}"]


def test_gpu_metrics_absent_when_nvml_sees_no_device_when_registered() -> None:
    registry = CollectorRegistry()
    collector = register_gpu_metrics(registry, FakeNvml([]))
    assert collector.why_not == "NVML started and reports no GPU on this machine"
    assert gpu_lines(registry) == []


def test_gpu_metrics_report_each_device_at_scrape_time_when_nvml_answers() -> None:
    registry = CollectorRegistry()
    nvml = FakeNvml([(3 * GIB, 80 * GIB, 45), (0, 80 * GIB, 100)])
    register_gpu_metrics(registry, nvml)
    assert nvml.memory_reads == 0  # registering reads nothing
    nvml.devices[0] = (5 * GIB, 80 * GIB, 45)  # what a scrape reports is the device's state then
    assert registry.get_sample_value(MEMORY_USED, {"gpu": "0"}) == 5 * GIB
    assert registry.get_sample_value(MEMORY_TOTAL, {"gpu": "0"}) == 80 * GIB
    assert registry.get_sample_value(UTILIZATION, {"gpu": "0"}) == 0.45
    assert registry.get_sample_value(MEMORY_USED, {"gpu": "1"}) == 0
    assert registry.get_sample_value(UTILIZATION, {"gpu": "1"}) == 1.0
    assert len([line for line in gpu_lines(registry) if not line.startswith("#")]) == 6


def test_gpu_metrics_leave_out_a_reading_the_device_refuses_when_scraped(caplog: pytest.LogCaptureFixture) -> None:
    """A MIG-enabled GPU gives no utilisation: its memory still shows, the scrape succeeds, one warning in all."""
    collector = GpuCollector(FakeNvml([(GIB, 2 * GIB, FakeNvmlError("Not Supported")), (GIB, 2 * GIB, 10)]))
    registry = CollectorRegistry()
    registry.register(collector)
    with caplog.at_level(logging.WARNING, logger="services.gateway.backends.nvml"):
        for _ in range(2):
            assert registry.get_sample_value(UTILIZATION, {"gpu": "0"}) is None
            assert registry.get_sample_value(UTILIZATION, {"gpu": "1"}) == 0.1
            assert registry.get_sample_value(MEMORY_USED, {"gpu": "0"}) == GIB
    assert len(caplog.records) == 1
    assert "GPU 0: NVML gives no utilization (FakeNvmlError: Not Supported)" in caplog.records[0].getMessage()


def test_gateway_app_registers_gpu_metrics_and_says_why_there_are_none_when_created(
    settings: Settings, backend: ScriptedBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """The app asks NVML itself; on this CPU machine it logs why there are no GPU series, and has none."""
    registry = CollectorRegistry()
    with caplog.at_level(logging.INFO, logger="services.gateway.backends.nvml"):
        create_app(settings, backend=backend, registry=registry)
    assert [r.getMessage()[:15] for r in caplog.records] == ["no GPU metrics:"]
    assert gpu_lines(registry) == []
    assert b"switchyard_requests_total" in generate_latest(registry)


@pytest.mark.slow  # imports torch (its line of the report): about a second
@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="onnxruntime-gpu is installed here")
def test_gpu_install_check_says_not_ready_with_the_cpu_onnxruntime_when_run() -> None:
    """The last step of ``make install-gpu``, on this machine's CPU wheel: not ready, and why."""
    ready, lines = gpu_install_report()
    assert not ready
    assert lines[0] == f"onnxruntime {ort.__version__} offers {', '.join(ort.get_available_providers())}"
    assert lines[1].startswith("NOT READY: no CUDAExecutionProvider")
    assert any(line.startswith("no GPU to run on here: ") for line in lines)
