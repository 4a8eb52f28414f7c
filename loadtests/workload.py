"""What the benches drive: the example models (input name, row shape) and a repository that holds them.

``ROOT`` is the checkout: the default repository lives there and the servers are started from it. The
exporters import torch lazily: it is slow to import and only needed when the repository is missing.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    # name: (input name, per-row shape)
    "classifier": ("image", (3, 64, 64)),
    "mlp": ("features", (32,)),
}


def latest_onnx(repository: Path, model: str) -> Path:
    versions = sorted(int(p.name) for p in (repository / model).iterdir() if p.name.isdigit())
    return repository / model / str(versions[-1]) / "model.onnx"


def ensure_repository(requested: Path, prefix: str, export_into: Callable[[Path], object]) -> Path:
    """``requested`` when it holds both examples, else a fresh temporary one that ``export_into`` fills."""
    if all((requested / model / "config.pbtxt").is_file() for model in MODELS):
        return requested
    target = Path(tempfile.mkdtemp(prefix=prefix))
    print(f"{requested} lacks the example models; exporting them to {target}", flush=True)
    export_into(target)
    return target


def export_first_versions(target: Path) -> None:
    """Version 1 of each example with the exporter's defaults (``make models`` writes versions 1 and 2)."""
    from examples import models
    from exporter import export

    export(
        models.build_classifier(),
        models.classifier_inputs(2),
        name="classifier",
        repository=target,
        input_names=["image"],
        output_names=["logits"],
    )
    export(models.build_mlp(), models.mlp_inputs(2), name="mlp", repository=target, input_names=["features"])


def export_all_versions(target: Path) -> None:
    """Versions 1 and 2 of each example, as ``make models`` writes them."""
    from examples.export_examples import export_examples

    export_examples(target)
