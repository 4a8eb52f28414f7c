"""Session-wide fixtures shared by the test packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples import models
from examples.export_examples import export_examples
from exporter import export


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make models` writes (classifier and mlp, ONNX versions 1 and 2, policy ``all``), plus
    ``mlp_ts``: the MLP as TorchScript version 1. Exported once per test session; treat it as read-only."""
    root = tmp_path_factory.mktemp("model_repository")
    export_examples(root)
    export(models.build_mlp(), models.mlp_inputs(2), name="mlp_ts", repository=root, format="torchscript")
    return root
