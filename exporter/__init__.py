"""Switchyard exporter: PyTorch module -> verified ONNX / TorchScript -> Triton model repository."""

from exporter.api import ExportResult, export
from exporter.errors import (
    DynamicBatchError,
    ExportError,
    InvalidSpecError,
    ModelError,
    ParityError,
    RepositoryError,
    UnsupportedOperatorError,
)
from exporter.specs import TensorSpec, VersionPolicy

__all__ = [
    "DynamicBatchError",
    "ExportError",
    "ExportResult",
    "InvalidSpecError",
    "ModelError",
    "ParityError",
    "RepositoryError",
    "TensorSpec",
    "UnsupportedOperatorError",
    "VersionPolicy",
    "export",
]
