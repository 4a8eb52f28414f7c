"""Where the parity gate runs: on the device the export is for.

``--kind gpu`` (``kind="gpu"``) writes ``KIND_GPU`` instance groups, so the gate runs the artifact on ``cuda:0``
when this process can: TorchScript loaded onto the GPU with the inputs there, against eager PyTorch on the same
device (the kernels a GPU serves with are the ones checked); ONNX in onnxruntime's ``CUDAExecutionProvider``
against eager PyTorch on the CPU (the exporter's torch is often the CPU build, and the CPU's fp32 is the stricter
reference). Without a usable GPU the gate runs on the CPU and the result says why, so that nobody reads a CPU check
as a GPU one. ``kind="cpu"`` runs where it always did, and says nothing more."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from exporter.specs import Format, Kind

GPU = "cuda:0"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


@dataclass(frozen=True)
class ParityDevice:
    """Where the artifact ran in the gate (``runtime``) and where eager PyTorch ran (``eager``)."""

    runtime: str = "cpu"
    eager: str = "cpu"
    asked_gpu: bool = False
    """The export is for GPUs (``kind="gpu"``)."""
    why_cpu: str = ""
    """Why a GPU export's gate ran on the CPU (empty otherwise)."""

    @property
    def note(self) -> str:
        """One line for the summary and the manifest; empty for a CPU export, which says what it always said."""
        if self.runtime != "cpu":
            return f"parity checked on {self.runtime}"
        if self.asked_gpu:
            return f"parity checked on the CPU: no usable GPU ({self.why_cpu})"
        return ""

    def on_cpu(self, why: str) -> ParityDevice:
        """The same export checked on the CPU after all, for ``why``."""
        return ParityDevice(asked_gpu=self.asked_gpu, why_cpu=why)


ON_CPU = ParityDevice()


def choose_parity_device(kind: Kind, format: Format) -> ParityDevice:
    """Where the gate should run an export of ``kind`` in ``format``, as far as can be known before loading it."""
    if kind != "gpu":
        return ON_CPU
    asked = ParityDevice(asked_gpu=True)
    why = gpu_unusable(format)
    if why:
        return asked.on_cpu(why)
    eager = GPU if format == "torchscript" else "cpu"
    return ParityDevice(runtime=GPU, eager=eager, asked_gpu=True)


def gpu_unusable(format: Format) -> str:
    """Why this process cannot run ``format`` on ``cuda:0`` (empty when it can)."""
    if format == "onnx":
        import onnxruntime as ort

        providers = ort.get_available_providers()
        if CUDA_PROVIDER not in providers:
            return (f"the installed onnxruntime has no {CUDA_PROVIDER}, it offers {', '.join(providers)}; "
                    "make install-gpu installs onnxruntime-gpu")
        return ""
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return ""


def onnx_providers(device: ParityDevice) -> list[Any]:
    """onnxruntime's providers for the gate's session. TF32 stays off on the GPU: the reference is eager fp32 on the
    CPU, and TF32's 10-bit mantissa would fail a 1e-4 tolerance that the serving config never asked to loosen."""
    if device.runtime == "cpu":
        return [CPU_PROVIDER]
    index = int(device.runtime.partition(":")[2] or 0)
    return [(CUDA_PROVIDER, {"device_id": index, "use_tf32": 0}), CPU_PROVIDER]


def onnx_started(device: ParityDevice, providers: list[str]) -> ParityDevice:
    """What the session really runs on: onnxruntime starts on the CPU alone, logging only, when the CUDA provider
    cannot load its libraries (CUDA or cuDNN missing or of another major version)."""
    if device.runtime == "cpu" or (providers and providers[0] == CUDA_PROVIDER):
        return device
    return device.on_cpu(f"onnxruntime could not start {CUDA_PROVIDER} (the session runs on {', '.join(providers)}); "
                         "check that CUDA 12 and cuDNN 9 libraries are installed (make install-gpu)")


@contextmanager
def eager_on(module: nn.Module, device: str) -> Iterator[None]:
    """``module`` on ``device`` for the gate, back on the CPU after it, where the rest of the export expects it."""
    if device == "cpu":
        yield
        return
    module.to(device)
    try:
        yield
    finally:
        module.to("cpu")
