"""TorchScript export: ``torch.jit.script`` first, so data-dependent control flow survives; a
trace only where scripting fails, and never one that decided on data (``exporter.control_flow``).
The flat adapter around the module is always traced (it has no control flow), and tracing keeps a
scripted submodule's branches intact."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from exporter.control_flow import control_flow_error, recorded_decisions
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


def export_torchscript(prepared: PreparedModel, path: Path) -> TorchScriptArtifact:
    with fresh_torch_state():
        return _script_or_trace(prepared, path)


def _script_or_trace(prepared: PreparedModel, path: Path) -> TorchScriptArtifact:
    script_failure: Exception | None = None
    try:
        flat = FlatModule(torch.jit.script(prepared.flat.inner), prepared.flat.keyword_names)
        exporter = SCRIPT
    except Exception as exc:  # scripting fails on plenty of valid Python; tracing is the fallback
        script_failure = exc
        flat = prepared.flat
        exporter = TRACE
    script_error = _first_line(script_failure) if script_failure is not None else None
    with recorded_decisions() as decisions, torch.no_grad():
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
    if decisions and exporter == TRACE:
        raise control_flow_error(decisions, fmt="torchscript", evidence="scripting failed, so it would be traced",
                                 script_error=script_failure)
    traced.save(str(path))
    return TorchScriptArtifact(path, exporter, script_error)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
