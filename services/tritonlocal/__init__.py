"""A real Triton Inference Server (CPU, python backend) from the nvidia-pytriton wheel, for dev and tests.

It serves exporter repositories through a derived copy whose models run ``model.onnx`` / ``model.pt``
with onnxruntime / torch inside Triton's python backend.
"""

from services.tritonlocal.derive import (
    DerivedModel,
    DerivedRepository,
    build_derived_repository,
    derive_config,
    override_json,
)
from services.tritonlocal.errors import DerivedRepositoryError, TritonLocalError, TritonNotInstalled, TritonStartError
from services.tritonlocal.install import TritonInstall
from services.tritonlocal.server import LocalTriton, TritonPorts, free_port

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
    "build_derived_repository",
    "derive_config",
    "free_port",
    "override_json",
]
