"""GPU memory and utilisation per device on ``/metrics``, read from NVML when scraped (docs/architecture.md,
"Metrics").

NVML comes from ``nvidia-ml-py`` (module ``pynvml``, in the ``[gpu]`` extra). Without it, without a driver
(``nvmlInit`` fails) or without a device, the gateway logs why once at startup and adds no series: a CPU node's
``/metrics`` looks as it always did, and a scrape never fails because of a GPU. The ``gpu`` label is NVML's device
index, which ``CUDA_VISIBLE_DEVICES`` does not renumber (``nvidia-smi`` shows the same numbers).

NVML is initialised once and never shut down: its handles stay valid for the process's life, and a scrape then costs
three driver calls per device.

``python -m services.gateway.backends.nvml`` is the last step of the GPU install (``make install-gpu``, the
Dockerfile's ``build-gpu`` stage): it says whether onnxruntime offers ``CUDAExecutionProvider`` (exit 1 when not: the
install is wrong) and whether this machine has a GPU to run it on (exit 0 either way: an image is built without
one)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.extras import runtime_conflict

log = logging.getLogger(__name__)

MEMORY_USED = "switchyard_gpu_memory_used_bytes"
MEMORY_TOTAL = "switchyard_gpu_memory_total_bytes"
UTILIZATION = "switchyard_gpu_utilization_ratio"
INSTALL_HINT = "install the [gpu] extra (make install-gpu; docs/install.md, GPU nodes)"
CUDA_PROVIDER = "CUDAExecutionProvider"


@dataclass(frozen=True)
class NvmlStart:
    """What starting NVML gave: the library and one handle per device, or why there is nothing to read."""

    library: Any
    handles: tuple[Any, ...]
    why_not: str = ""


def start_nvml(library: Any | None = None) -> NvmlStart:
    """Import ``pynvml`` (unless ``library`` stands in for it), initialise it and take a handle per device."""
    if library is None:
        try:
            library = importlib.import_module("pynvml")
        except ImportError:
            return NvmlStart(None, (), f"the module pynvml (package nvidia-ml-py) is not installed; {INSTALL_HINT}")
    try:
        library.nvmlInit()
        count = int(library.nvmlDeviceGetCount())
        handles = tuple(library.nvmlDeviceGetHandleByIndex(index) for index in range(count))
    except Exception as exc:  # pynvml.NVMLError and ctypes' errors alike: no driver, a wrong driver, no permission
        return NvmlStart(library, (), f"NVML did not start ({type(exc).__name__}: {exc}); is the NVIDIA driver "
                                      "installed and the device visible to this process?")
    if not handles:
        return NvmlStart(library, (), "NVML started and reports no GPU on this machine")
    return NvmlStart(library, handles)


class GpuCollector(Collector):
    """The three ``switchyard_gpu_*`` gauges, one series per device, read when Prometheus scrapes.

    ``nvml`` stands in for the ``pynvml`` module (tests inject a small fake; the real one needs a GPU)."""

    def __init__(self, nvml: Any | None = None) -> None:
        started = start_nvml(nvml)
        self._nvml = started.library
        self._handles = started.handles
        self.why_not = started.why_not
        """Why there are no series (empty when there are)."""
        self._failing: set[tuple[int, str]] = set()

    @property
    def devices(self) -> int:
        return len(self._handles)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families by name only, so that registering never reads a device."""
        if self._handles:
            yield from _families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self._handles:
            return
        used, total, utilization = _families()
        for index, handle in enumerate(self._handles):
            gpu = str(index)
            memory = self._read(index, "memory", self._nvml.nvmlDeviceGetMemoryInfo, handle)
            if memory is not None:
                used.add_metric([gpu], float(memory.used))
                total.add_metric([gpu], float(memory.total))
            rates = self._read(index, "utilization", self._nvml.nvmlDeviceGetUtilizationRates, handle)
            if rates is not None:
                utilization.add_metric([gpu], float(rates.gpu) / 100.0)
        yield used
        yield total
        yield utilization

    def _read(self, index: int, what: str, call: Any, handle: Any) -> Any:
        """One NVML reading, or ``None`` when the device does not give it (a MIG-enabled GPU has no utilisation, a
        lost GPU nothing): that series is left out of this scrape, and the first failure of each kind is logged."""
        try:
            reading = call(handle)
        except Exception as exc:
            if (index, what) not in self._failing:
                self._failing.add((index, what))
                log.warning("GPU %d: NVML gives no %s (%s: %s); its series is left out of /metrics",
                            index, what, type(exc).__name__, exc)
            return None
        self._failing.discard((index, what))
        return reading


def register_gpu_metrics(registry: CollectorRegistry, nvml: Any | None = None) -> GpuCollector:
    """Add the GPU gauges to ``registry`` when NVML sees a device; log in one line what this process reports."""
    collector = GpuCollector(nvml)
    if collector.why_not:
        log.info("no GPU metrics: %s", collector.why_not)
        return collector
    registry.register(collector)
    log.info("GPU metrics: memory and utilisation of %d device(s) from NVML", collector.devices)
    return collector


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(MEMORY_USED, "GPU memory in use on the device, every process's (NVML).", labels=["gpu"]),
        GaugeMetricFamily(MEMORY_TOTAL, "GPU memory the device has (NVML).", labels=["gpu"]),
        GaugeMetricFamily(UTILIZATION, "Fraction of the last sample period in which a kernel ran on the device, 0-1 "
                                       "(NVML).", labels=["gpu"]),
    )


def gpu_install_report() -> tuple[bool, list[str]]:
    """Whether the installed onnxruntime can run models on a GPU, and lines saying what this machine offers."""
    import onnxruntime as ort

    providers = list(ort.get_available_providers())
    conflict = runtime_conflict()
    ready = CUDA_PROVIDER in providers and conflict is None
    lines = [f"onnxruntime {ort.__version__} offers {', '.join(providers)}"]
    if CUDA_PROVIDER not in providers:
        lines.append(f"NOT READY: no {CUDA_PROVIDER}, so this is the CPU onnxruntime wheel; remove it and install "
                     "onnxruntime-gpu (make install-gpu; docs/install.md, GPU nodes)")
    if conflict is not None:
        lines.append(f"NOT READY: {conflict}")
    started = start_nvml()
    if started.why_not:
        lines.append(f"no GPU to run on here: {started.why_not}. KIND_GPU models are refused on this machine "
                     "(SWITCHYARD_GPU_FALLBACK=cpu runs them on the CPU); fine for building an image")
    else:
        names = [_text(started.library.nvmlDeviceGetName(handle)) for handle in started.handles]
        lines.append(f"NVML sees {len(names)} GPU(s): " + ", ".join(f"{i}: {n}" for i, n in enumerate(names)))
    if importlib.util.find_spec("torch") is not None:  # TorchScript models run on torch's CUDA, not onnxruntime's
        import torch

        lines.append(f"torch {torch.__version__}: CUDA " + ("available" if torch.cuda.is_available() else
                                                             "not available (TorchScript models stay off the GPU)"))
    return ready, lines


def _text(value: Any) -> str:
    """NVML's strings: ``str`` from nvidia-ml-py 11.5 on, ``bytes`` before."""
    return value.decode() if isinstance(value, bytes) else str(value)


def main() -> int:
    ready, lines = gpu_install_report()
    print("\n".join(lines))
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main())
