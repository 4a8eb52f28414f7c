"""Switchyard exporter: PyTorch module -> verified ONNX / TorchScript -> Triton model repository.

``export`` and ``ExportResult`` load the pipeline (torch, onnx, onnxruntime) on first access, so importing
the package, its errors and specs stays cheap: the ``switchyard`` command imports it on serving nodes too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from exporter.errors import (
    DataDependentControlFlowError,
    DynamicBatchError,
    ExportError,
    InvalidSpecError,
    ModelError,
    ParityError,
    RepositoryError,
    RowDependenceError,
    UnsupportedOperatorError,
)
from exporter.specs import TensorSpec, VersionPolicy
from services.extras import require

if TYPE_CHECKING:
    from exporter.api import ExportResult, export

__all__ = [
    "DataDependentControlFlowError",
    "DynamicBatchError",
    "ExportError",
    "ExportResult",
    "InvalidSpecError",
    "ModelError",
    "ParityError",
    "RepositoryError",
    "RowDependenceError",
    "TensorSpec",
    "UnsupportedOperatorError",
    "VersionPolicy",
    "export",
]

_LAZY = {"export": "exporter.api", "ExportResult": "exporter.api"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for toolchain in ("torch", "onnx", "onnxscript"):  # on a serving node: name the extra, not a bare module
        require(toolchain, extra="export", feature=f"exporter.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value
