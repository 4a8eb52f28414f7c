"""What importing the exporter costs: a serving node imports the package (the ``switchyard`` command
registers ``export``) without the ``export`` extra, so only the pipeline may pull torch and onnx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import exporter

ROOT = Path(__file__).parents[2]
HEAVY = ("torch", "onnx", "onnxscript", "onnxruntime")
REPORT_HEAVY = f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          check=False)


@pytest.mark.parametrize(
    "imports",
    [
        "import exporter; from exporter import ExportError, TensorSpec, VersionPolicy",
        "import exporter.cli, exporter.specs, exporter.errors, exporter.dtypes",
    ],
)
def test_exporter_imports_no_toolchain_when_pipeline_is_not_used(imports: str) -> None:
    done = python(f"import sys; {imports}; {REPORT_HEAVY}")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_exporter_loads_pipeline_when_export_is_accessed() -> None:
    done = python(
        f"import sys, exporter; {REPORT_HEAVY}; from exporter import ExportResult, export; "
        "print(export.__module__, ExportResult.__module__, export is exporter.export, 'torch' in sys.modules)"
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "exporter.api exporter.api True True"]


def test_exporter_has_no_attribute_when_name_is_neither_public_nor_a_submodule() -> None:
    assert not hasattr(exporter, "no_such_name")


def test_exporter_names_the_extra_when_export_is_imported_without_torch() -> None:
    done = python(
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    from exporter import export\n"
        "except ImportError as exc:\n    print(type(exc).__name__, exc)"
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "MissingExtra exporter.export needs the 'export' extra (torch is not installed): "
        "pip install 'switchyard[export]'"
    )
