"""A runtime's one-time share of memory, taken before the first model that needs it loads.

The model cache (``capacity/``) charges each load what the process grew by. The first model a runtime runs would be
charged the runtime itself: torch's import (~190 MiB) and its first TorchScript load (~60 MiB more), onnxruntime's
first session (~10 MiB), measured on the 2-core machine; on a GPU, the device's CUDA context too. A 1 MiB TorchScript
model then read as needing ~250 MiB, more than a small cache's whole budget, and was refused with 507.
``prime_runtime`` does that one-time work on a model of its own, once per process and device, so that a load's
growth is the model's."""

from __future__ import annotations

import io
import logging
import threading

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2

from services.extras import require
from services.gateway.backends.devices import CPU, Device, NoUsableGpu, onnx_providers, plan_instances
from services.gateway.backends.loop_holds import LOOP_HOLDS
from services.modelrepo import layout

log = logging.getLogger(__name__)

IDENTITY_ONNX = (
    b'\x08\x07\x12\x00:;\n\x10\n\x01x\x12\x01y"\x08Identity\x12\x05primeZ\x0f\n\x01x\x12\n\n\x08\x08\x01\x12\x04'
    b"\n\x02\x08\x01b\x0f\n\x01y\x12\n\n\x08\x08\x01\x12\x04\n\x02\x08\x01B\x04\n\x00\x10\r"
)
"""A one-node ONNX model, ``y = Identity(x)`` of one float (IR 7, opset 13), as ``onnx.helper`` serializes it: the
base install has onnxruntime but not the onnx package (``tests/gateway/test_model_cache_costs.py`` builds it again)."""

_primed: set[tuple[str, Device]] = set()
_lock = threading.Lock()


def prime_runtime(platform: str, device: Device = CPU) -> bool:
    """Start the runtime ``platform``'s models run on, on ``device``, once per process: an onnxruntime session, or
    torch imported and a small TorchScript module loaded and run. False when there was nothing to do (done before,
    a platform the embedded backend does not run) or it could not be done (torch not installed, a GPU that does not
    start): the model's own load then says why. Blocking."""
    with _lock:
        if (platform, device) in _primed:
            return False
        try:
            if platform == layout.ONNX_PLATFORM:
                _prime_onnxruntime(device)
            elif platform == layout.TORCHSCRIPT_PLATFORM:
                _prime_torch(device)
            else:
                return False
        except Exception as exc:  # noqa: BLE001 - the load that follows reports the runtime's problem
            log.debug("could not start the runtime of %s on %s ahead of a load: %s", platform, device, exc)
            return False
        _primed.add((platform, device))
        return True


def prime_model_runtime(config: model_config_pb2.ModelConfig, platform: str, fallback: str) -> bool:
    """``prime_runtime`` on every device a model's instances are placed on (``SWITCHYARD_GPU_FALLBACK`` is
    ``fallback``); True when one started now. Blocking: placing the instances may import torch to look for GPUs."""
    try:
        devices = sorted(set(plan_instances(config, platform, fallback=fallback).devices))
    except NoUsableGpu:  # the load says so (or, with the fallback allowed, runs on the CPU)
        devices = [CPU]
    with LOOP_HOLDS.holding():  # importing torch and its first runs keep the GIL for seconds
        started = [prime_runtime(platform, device) for device in devices]  # every device, not the first only
    return any(started)


def _prime_onnxruntime(device: Device) -> None:
    session = ort.InferenceSession(IDENTITY_ONNX, providers=onnx_providers(device, tensorrt=False))
    session.run(None, {"x": np.zeros(1, np.float32)})


def _prime_torch(device: Device) -> None:
    torch = require("torch", extra="export", feature="serving a TorchScript model")
    # A convolution and a linear layer, not an identity: their runs start the kernel libraries a model's first call
    # would (oneDNN and BLAS on the CPU, cuDNN and cuBLAS on a GPU). Measured with the example CNN after it: its
    # first load grew the process 6 MiB more than its second, 19 MiB with a linear layer alone.
    layers = [torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 2)]
    module = torch.nn.Sequential(*layers).eval()
    with torch.no_grad():
        traced = torch.jit.trace(module, torch.zeros(1, 1, 4, 4))
    saved = io.BytesIO()
    torch.jit.save(traced, saved)
    saved.seek(0)
    loaded = torch.jit.load(saved, map_location=str(device)).eval()
    with torch.inference_mode():
        loaded(torch.zeros(1, 1, 4, 4, device=str(device)))
        loaded(torch.zeros(3, 1, 4, 4, device=str(device))).cpu()
