"""The exporter's error types. Every failure the user can act on is an ``ExportError`` whose
message names the cause and the fix; subclasses let callers and tests tell the causes apart."""

from __future__ import annotations

from pathlib import Path


class ExportError(Exception):
    """An export that cannot produce a faithful, servable model version."""

    log_path: Path | None = None
    """The exporters' own diagnostics (graphs, tracer and exporter warnings) of the failed export, kept for
    reading; set by ``export()`` when there were any."""

    def __str__(self) -> str:
        message = super().__str__()
        if self.log_path is None:
            return message
        return f"{message} (the exporters' diagnostics are in {self.log_path})"


class InvalidSpecError(ExportError):
    """Bad arguments: model name, version, tensor names, shapes, dtypes or options."""


class ModelError(ExportError):
    """The module itself cannot be exported as given (forward raises, mixed devices, QAT modules...)."""


class DataDependentControlFlowError(ModelError):
    """``forward`` decides on its inputs' values or batch size (``if x.sum() > 0``, ``len(x)``, ``.item()``) and
    no exporter could keep both ways of the decision; a trace would have frozen the one the example took."""

    def __init__(self, message: str, locations: tuple[str, ...]) -> None:
        super().__init__(message)
        self.locations = locations
        """``file:line: code`` of each place in the model's code that decides on data, as far as known."""


class RowDependenceError(ModelError):
    """A row's answer depends on the other rows of its batch (``softmax(dim=0)``, ``x - x.mean(0)``, batch
    statistics): the dynamic batcher merges different clients' requests into one batch, so each client's answer
    would depend on its neighbours'."""


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
