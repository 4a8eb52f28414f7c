"""A real Triton Inference Server (CPU, python backend) from the nvidia-pytriton wheel, for dev and tests.

It serves a model repository through a derived copy whose ONNX and TorchScript models run with onnxruntime /
torch inside Triton's python backend (this build has no other backend).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.tritonlocal.derive import DerivedModel, DerivedRepository, build_derived_repository, derive_config
    from services.tritonlocal.errors import (
        DerivedRepositoryError,
        TritonLocalError,
        TritonNotInstalled,
        TritonStartError,
    )
    from services.tritonlocal.install import TritonInstall
    from services.tritonlocal.processes import free_port, free_ports
    from services.tritonlocal.server import LocalTriton, TritonPorts
    from services.tritonlocal.tracing import TritonTracing, tracing_from_environment

# Loaded on first access: `switchyard serve` imports this package only to register `switchyard triton`.
_HOMES = {
    "DerivedModel": "derive",
    "DerivedRepository": "derive",
    "build_derived_repository": "derive",
    "derive_config": "derive",
    "DerivedRepositoryError": "errors",
    "TritonLocalError": "errors",
    "TritonNotInstalled": "errors",
    "TritonStartError": "errors",
    "TritonInstall": "install",
    "free_port": "processes",
    "free_ports": "processes",
    "LocalTriton": "server",
    "TritonPorts": "server",
    "TritonTracing": "tracing",
    "tracing_from_environment": "tracing",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'services.tritonlocal' has no attribute {name!r}")
    return getattr(importlib.import_module(f"services.tritonlocal.{home}"), name)


__all__ = [
    "DerivedModel",
    "DerivedRepository",
    "DerivedRepositoryError",
    "LocalTriton",
    "TritonInstall",
    "TritonLocalError",
    "TritonNotInstalled",
    "TritonPorts",
    "TritonStartError",
    "TritonTracing",
    "build_derived_repository",
    "derive_config",
    "free_port",
    "free_ports",
    "tracing_from_environment",
]
