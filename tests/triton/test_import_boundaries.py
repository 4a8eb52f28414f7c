"""A gateway in front of Triton never imports torch, onnx, onnxscript or the exporter."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from services.tritonlocal import LocalTriton
from tests.import_probe import probe

pytestmark = pytest.mark.slow  # a local Triton


def test_triton_gateway_imports_no_build_time_module_when_serving_onnx_models(
    triton: LocalTriton, repository: Path
) -> None:
    result = probe(str(repository), "triton", triton.grpc_url)
    assert result["answered"] == {"classifier": 200, "mlp": 200}, (result["why"], result["log"])
    if result["why"]:  # ready in the end, but not at once: said in the run's warnings, not hidden
        warnings.warn(f"not ready at first after start-up: {result['why']}", stacklevel=1)
    # The local CPU Triton's twin configs come from services.tritonlocal.derive, handed in as `serve
    # --triton-local-cpu` does; a production Triton needs nothing from that package.
    imported = result["imported"]
    assert isinstance(imported, list)
    assert [m for m in imported if not m.startswith("services.tritonlocal")] == []
