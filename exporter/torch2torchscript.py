"""TorchScript export: ``torch.jit.script`` first, so data-dependent control flow survives; a
trace only where scripting fails. The flat adapter around the module is always traced (it has
no control flow), and tracing keeps a scripted submodule's branches intact."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.jit._trace import TracerWarning

from exporter.errors import ExportError
from exporter.isolation import fresh_torch_state
from exporter.module_io import FlatModule, PreparedModel

SCRIPT = "torch.jit.script"
TRACE = "torch.jit.trace"


@dataclass(frozen=True)
class TorchScriptArtifact:
    path: Path
    exporter: str
    script_error: str | None
    tracer_warnings: list[str] = field(default_factory=list)


def export_torchscript(prepared: PreparedModel, path: Path) -> TorchScriptArtifact:
    with fresh_torch_state():
        return _script_or_trace(prepared, path)


def _script_or_trace(prepared: PreparedModel, path: Path) -> TorchScriptArtifact:
    inner = prepared.flat.inner
    script_error: str | None = None
    try:
        with _quiet_warnings():
            scripted = torch.jit.script(inner)
        flat = FlatModule(scripted, prepared.flat.keyword_names)
        exporter = SCRIPT
    except Exception as exc:  # scripting fails on plenty of valid Python; tracing is the fallback
        script_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        flat = prepared.flat
        exporter = TRACE
    tracer_warnings: list[str] = []
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        try:
            traced = torch.jit.trace(  # type: ignore[no-untyped-call]
                flat.eval(), prepared.examples, check_trace=False, strict=False
            )
        except Exception as exc:
            raise ExportError(
                f"TorchScript export failed: scripting said {script_error or 'nothing'}, and tracing raised "
                f"{type(exc).__name__}: {exc}. Make forward() scriptable (type-annotate it, avoid dynamic "
                "Python features) or export with format='onnx'."
            ) from exc
    tracer_warnings = sorted({str(w.message).splitlines()[0] for w in caught
                              if issubclass(w.category, TracerWarning)})
    traced.save(str(path))
    return TorchScriptArtifact(path, exporter, script_error, tracer_warnings)


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
