"""Where the embedded backend runs each instance of a model: the config's ``instance_group`` read as Triton reads it.

``KIND_CPU`` (and ``KIND_MODEL``) instances run on the CPU; ``KIND_GPU`` instances on the GPUs the group lists
(``gpus: [0, 1]``; none listed: every visible GPU), ``count`` instances on each; ``KIND_AUTO`` on the GPUs when one is
usable, else on the CPU. A ``KIND_GPU`` group on a process without a usable GPU never runs on the CPU unnoticed: the
model is unavailable with the reason, unless ``SWITCHYARD_GPU_FALLBACK=cpu`` says to run it there (logged as a
warning, and labelled on ``switchyard_model_instances``).

Usable means: for ONNX, onnxruntime offers ``CUDAExecutionProvider`` (the ``[gpu]`` extra's onnxruntime-gpu), and the
TensorRT provider too when the config asks for it (``optimization { execution_accelerators {
gpu_execution_accelerator { name: "tensorrt" } } }``); for TorchScript, torch sees CUDA devices. The device count
comes from torch for TorchScript; for ONNX (no torch in the base install) a device that does not exist fails the
version's load with onnxruntime's own message."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import onnxruntime as ort
from tritonclient.grpc import model_config_pb2

from services.modelrepo import layout

CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
FALLBACK_SETTING = "SWITCHYARD_GPU_FALLBACK"

_KIND = model_config_pb2.ModelInstanceGroup.Kind


@dataclass(frozen=True, order=True)
class Device:
    kind: str
    """``cpu`` or ``cuda``."""
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


CPU = Device("cpu")


@dataclass(frozen=True)
class Gpus:
    """What this process can run on a GPU for one platform: the visible devices (``None``: not known without torch),
    or why none is usable."""

    usable: bool
    count: int | None
    why_not: str = ""


@dataclass(frozen=True)
class InstancePlan:
    devices: tuple[Device, ...]
    """One per instance, in the config's order."""
    fell_back: bool = False
    """A ``KIND_GPU`` group runs on the CPU because ``SWITCHYARD_GPU_FALLBACK=cpu`` said so."""
    tensorrt: bool = False
    """The config asks onnxruntime's TensorRT provider for its GPU instances."""


class NoUsableGpu(Exception):
    """A ``KIND_GPU`` model on a process that cannot run it on a GPU (the message says why and what to do)."""


def gpus(platform: str) -> Gpus:
    """What this process offers ``platform``'s models on GPUs."""
    if platform == layout.ONNX_PLATFORM:
        providers = ort.get_available_providers()
        if CUDA not in providers:
            return Gpus(False, 0, f"the installed onnxruntime has no {CUDA} (it offers {', '.join(providers)}); a GPU "
                                  "node installs onnxruntime-gpu (README: Install, GPU nodes)")
        return Gpus(True, _visible_count())
    torch: Any = _torch()
    if torch is None:
        return Gpus(False, 0, "torch is not installed")
    if not torch.cuda.is_available():
        return Gpus(False, 0, f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
    return Gpus(True, int(torch.cuda.device_count()))


def plan_instances(
    config: model_config_pb2.ModelConfig, platform: str, *, fallback: str, offered: Gpus | None = None
) -> InstancePlan:
    """Each instance's device. Raises ``NoUsableGpu`` for a ``KIND_GPU`` group this process cannot place, unless
    ``fallback`` is ``cpu``. ``offered``: what ``gpus(platform)`` answers (computed when not given)."""
    groups = list(config.instance_group) or [model_config_pb2.ModelInstanceGroup(count=1, kind=_KIND.KIND_CPU)]
    tensorrt = _asks_tensorrt(config)
    wants_gpu = any(g.kind in (_KIND.KIND_GPU, _KIND.KIND_AUTO) for g in groups)
    offer = offered if offered is not None else (gpus(platform) if wants_gpu else Gpus(False, 0))
    if offer.usable and tensorrt and platform == layout.ONNX_PLATFORM and TENSORRT not in ort.get_available_providers():
        offer = Gpus(False, 0, f"the config asks for the TensorRT execution accelerator and the installed onnxruntime "
                               f"has no {TENSORRT}")
    devices: list[Device] = []
    fell_back = False
    for number, group in enumerate(groups):
        count = max(int(group.count), 1)
        on_gpu = group.kind == _KIND.KIND_GPU or (group.kind == _KIND.KIND_AUTO and offer.usable)
        if not on_gpu:
            devices += [CPU] * count
            continue
        if not offer.usable:
            if fallback != "cpu":
                raise NoUsableGpu(
                    f"instance group {group.name or number} is KIND_GPU and this process has no usable GPU: "
                    f"{offer.why_not}; set {FALLBACK_SETTING}=cpu to run it on the CPU instead"
                )
            devices += [CPU] * count
            fell_back = True
            continue
        listed = [int(g) for g in group.gpus] or list(range(offer.count if offer.count is not None else 1))
        missing = [g for g in listed if offer.count is not None and not 0 <= g < offer.count]
        if missing:
            if fallback != "cpu":
                raise NoUsableGpu(
                    f"instance group {group.name or number} lists GPU(s) {missing}, and this process sees "
                    f"{offer.count} (0 to {offer.count - 1 if offer.count else 'none'}); set {FALLBACK_SETTING}=cpu "
                    "to run it on the CPU instead"
                )
            devices += [CPU] * (count * len(listed))
            fell_back = True
            continue
        for gpu in listed:
            devices += [Device("cuda", gpu)] * count
    return InstancePlan(tuple(devices), fell_back, tensorrt)


def onnx_providers(device: Device, *, tensorrt: bool) -> list[Any]:
    """onnxruntime's providers for a session on ``device``, first choice first; the CPU provider last on a GPU runs
    the few nodes the GPU providers do not implement."""
    if device.kind == "cpu":
        return [CPU_PROVIDER]
    options = {"device_id": device.index}
    gpu = [(TENSORRT, dict(options))] if tensorrt else []
    return [*gpu, (CUDA, dict(options)), CPU_PROVIDER]


def _asks_tensorrt(config: model_config_pb2.ModelConfig) -> bool:
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    return any(a.name.lower() == "tensorrt" for a in accelerators)


def _visible_count() -> int | None:
    """Devices CUDA_VISIBLE_DEVICES names, when it names any; else unknown (onnxruntime reports a missing one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch
