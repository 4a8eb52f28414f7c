"""The exporter's error types. Every failure the user can act on is an ``ExportError`` whose
message names the cause and the fix; subclasses let callers and tests tell the causes apart."""

from __future__ import annotations


class ExportError(Exception):
    """An export that cannot produce a faithful, servable model version."""


class InvalidSpecError(ExportError):
    """Bad arguments: model name, version, tensor names, shapes, dtypes or options."""


class ModelError(ExportError):
    """The module itself cannot be exported as given (forward raises, mixed devices, QAT modules...)."""


class UnsupportedOperatorError(ExportError):
    """An operator that no available exporter can convert."""

    def __init__(self, message: str, operator: str) -> None:
        super().__init__(message)
        self.operator = operator


class DynamicBatchError(ExportError):
    """An input or output whose batch axis did not come out dynamic."""


class ParityError(ExportError):
    """The exported artifact's outputs differ from eager PyTorch beyond tolerance."""


class RepositoryError(ExportError):
    """The model repository refuses the write (existing version, changed signature, I/O error)."""
