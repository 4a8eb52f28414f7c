"""A serving gateway never imports the exporter's toolchain: torch, onnx and onnxscript stay out of a process that
serves ONNX models, and the dev-only local-Triton package stays out unless its twin configs are asked for."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.import_probe import ROOT, probe


@pytest.mark.slow
def test_embedded_gateway_imports_no_build_time_module_when_serving_onnx_models(
    repository: Path, tmp_path: Path
) -> None:
    onnx_only = tmp_path / "repository"
    for model in ("classifier", "mlp"):  # the session repository also holds a TorchScript model
        shutil.copytree(repository / model, onnx_only / model)
    result = probe(str(onnx_only), "embedded")
    assert result["answered"] == {"classifier": 200, "mlp": 200}, (result["why"], result["log"])
    if result["why"]:  # ready in the end, but not at once: said in the run's warnings, not hidden
        warnings.warn(f"not ready at first after start-up: {result['why']}", stacklevel=1)
    assert result["imported"] == []


def test_switchyard_command_loads_only_other_commands_options_when_it_starts() -> None:
    code = (
        "import json, services.cli, services.gateway.server, tests.import_probe as probe;"
        "print(json.dumps(probe.watched_modules()))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The root command registers `switchyard triton` and `switchyard export`: their option lists only. The
    # launcher, the derived-repository builder and the export pipeline load when those commands run.
    assert json.loads(done.stdout) == [
        "exporter",
        "exporter.cli",
        "exporter.dtypes",
        "exporter.errors",
        "exporter.specs",
        "services.tritonlocal",
        "services.tritonlocal.cli",
        "services.tritonlocal.errors",
    ]
