"""Export the example models as versions 1 and 2 (``make models``). Existing versions are kept.

Usage: ``python -m examples.export_examples [--repository model_repository]``
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from torch import nn

from examples import models
from exporter import ExportResult, export
from exporter.cli import summary_table
from exporter.repository import ModelRepository


@dataclass(frozen=True)
class Example:
    name: str
    input_name: str
    versions: dict[int, Callable[[], nn.Module]]
    inputs: Callable[[int, int], torch.Tensor]
    output_names: tuple[str, ...] | None = None


EXAMPLES = (
    Example("classifier", models.CLASSIFIER_INPUT,
            {1: models.build_classifier, 2: models.build_classifier_v2}, models.classifier_inputs,
            output_names=(models.CLASSIFIER_OUTPUT,)),
    Example("mlp", models.MLP_INPUT, {1: models.build_mlp, 2: models.build_mlp_v2}, models.mlp_inputs),
)


def export_examples(repository: str | Path = "model_repository", console: Console | None = None) -> list[ExportResult]:
    """Write every example version missing from ``repository``; both versions load (policy ``all``) and are
    released, so a gateway's first start routes to version 2."""
    repo = ModelRepository(repository)
    written = []
    for example in EXAMPLES:
        for version, build in example.versions.items():
            if version in repo.versions(example.name):
                if console:
                    console.print(f"{repo.model_dir(example.name) / str(version)} exists")
                continue
            if console:
                console.print(f"exporting {example.name} version {version}")
            result = export(
                build(), {example.input_name: example.inputs(2, 0)}, name=example.name, repository=repository,
                version=version, max_batch_size=32, version_policy="all", output_names=example.output_names,
                release=True,  # both versions: a gateway's first start serves version 2, as the docs show
            )
            if console:
                console.print(summary_table(result))
            written.append(result)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", default="model_repository")
    export_examples(parser.parse_args().repository, Console())


if __name__ == "__main__":
    main()
