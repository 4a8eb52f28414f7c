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
        scripted = FlatModule(torch.jit.script(prepared.flat.inner), prepared.flat.keyword_names)
    except Exception as exc:  # scripting fails on plenty of valid Python; tracing is the fallback
        script_failure = exc
    else:
        try:
            with recorded_decisions(), torch.no_grad():  # the scripted module keeps its decisions
                _trace(scripted, prepared).save(str(path))
            return TorchScriptArtifact(path, SCRIPT, None)
        except Exception as exc:
            # The adapter's trace cannot always call the scripted module (keyword-only parameters, nested dict
            # outputs): trace the model itself, as when scripting fails, rather than refuse a model a trace takes.
            script_failure = _TracingScriptedFailed(exc)
    script_error = _first_line(script_failure)
    with recorded_decisions() as decisions, torch.no_grad():
        try:
            traced = _trace(prepared.flat, prepared)
        except Exception as exc:
            raise ExportError(
                f"TorchScript export failed: scripting said {script_error}, and tracing raised "
                f"{type(exc).__name__}: {exc}. Make forward() scriptable (type-annotate it, avoid dynamic "
                "Python features) or export with format='onnx'."
            ) from exc
    if decisions:
        raise control_flow_error(decisions, fmt="torchscript", evidence="scripting failed, so it would be traced",
                                 script_error=script_failure)
    traced.save(str(path))
    return TorchScriptArtifact(path, TRACE, script_error)


class _TracingScriptedFailed(Exception):
    """Scripting took the model, but tracing the flat adapter around the scripted module failed."""

    def __str__(self) -> str:
        cause = self.args[0]
        return f"the scripted module could not be traced: {type(cause).__name__}: {_text(cause)}"


def _trace(flat: FlatModule, prepared: PreparedModel) -> torch.jit.ScriptModule:
    traced: torch.jit.ScriptModule = torch.jit.trace(  # type: ignore[no-untyped-call]
        flat.eval(), prepared.examples, check_trace=False, strict=False
    )
    return traced


def _text(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _first_line(error: Exception) -> str:
    if isinstance(error, _TracingScriptedFailed):
        return str(error)
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
