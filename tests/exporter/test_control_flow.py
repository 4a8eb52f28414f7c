"""Models that decide on their inputs' values or batch size: never published with one way of the decision frozen in.

Each export is either refused with ``DataDependentControlFlowError`` (naming the line) or published and right on
inputs that take each way, whichever way its example took, through the Python API and the command line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from typer.testing import CliRunner

from exporter import DataDependentControlFlowError, ExportResult, RowDependenceError, export
from services.cli import app
from tests.exporter import branching_models as models
from tests.exporter.helpers import listing

FORMATS = ("onnx", "torchscript")


def takes_first_way(kind: str, x: torch.Tensor) -> bool:
    if kind == "sign":
        return bool(x.sum() > 0)
    if kind == "batch":
        return x.shape[0] > 3
    return bool(x.max().item() > 1.0)


def served_answers(result: ExportResult, x: torch.Tensor) -> np.ndarray:
    path = result.model_dir / ("model.onnx" if result.format == "onnx" else "model.pt")
    if result.format == "onnx":
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        answer: np.ndarray = session.run(None, {result.inputs[0].name: x.numpy()})[0]
        return answer
    module = torch.jit.load(str(path))  # type: ignore[no-untyped-call]
    with torch.no_grad():
        out = module(x)
    return (out[0] if isinstance(out, tuple) else out).numpy()  # type: ignore[no-any-return]


def assert_right_each_way(result: ExportResult, kind: str) -> None:
    module = models.build(kind)
    inputs = models.each_way(kind)
    assert {takes_first_way(kind, x) for x in inputs} == {True, False}  # both ways are asked
    for x in inputs:
        with torch.no_grad():
            expected = module(x).numpy()
        np.testing.assert_allclose(served_answers(result, x), expected, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{kind} {result.format} batch {x.shape[0]}")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", models.KEPT_BOTH_WAYS)
def test_export_keeps_both_ways_when_forward_decides_on_data(repo: Path, kind: str, fmt: str) -> None:
    examples = models.examples(kind)
    assert {takes_first_way(kind, x) for x in examples} == {True, False}  # examples that take each way
    for index, example in enumerate(examples):
        result = export(models.build(kind), example, name=f"{kind}{index}", repository=repo,
                        format=fmt, max_batch_size=models.MAX_BATCH_SIZE[kind])  # type: ignore[arg-type]

        assert_right_each_way(result, kind)
        assert result.exporter.startswith("torch.jit.script"), result.exporter


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_refuses_batch_size_decision_as_row_dependence_when_the_artifact_kept_both_ways(
    repo: Path, fmt: str
) -> None:
    # The parity gate runs batches on each side of the decision (1, 7, 32) first: a frozen decision would fail
    # there with ParityError (or be refused with DataDependentControlFlowError); kept, it is the rows' dependence
    # on their batch that refuses it.
    for example in models.examples("batch"):
        with pytest.raises(RowDependenceError, match=r"^output 'output' of a row depends on the other rows"):
            export(models.build("batch"), example, name="m", repository=repo, format=fmt)  # type: ignore[arg-type]
        assert listing(repo) == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", sorted(models.UNSCRIPTABLE))
def test_export_refuses_naming_the_line_when_only_a_trace_could_take_the_decision(
    repo: Path, kind: str, fmt: str
) -> None:
    torch.manual_seed(0)
    for seed in range(0, 20, 5):
        with pytest.raises(DataDependentControlFlowError) as caught:
            export(models.UNSCRIPTABLE[kind]().eval(), models.example(seed), name="m", repository=repo,
                   format=fmt)  # type: ignore[arg-type]

        assert caught.value.locations[0].startswith(f"{models.__file__}:")
        assert "if x.sum() > 0:" in str(caught.value) or "if x.max().item() > 1.0:" in str(caught.value)
        assert "torch.where" in str(caught.value)
        assert listing(repo) == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [None, "torchscript"])  # None: the default format, ONNX
@pytest.mark.parametrize("kind", models.KEPT_BOTH_WAYS)
def test_cli_export_keeps_both_ways_when_forward_decides_on_data(repo: Path, kind: str, fmt: str | None) -> None:
    runner = CliRunner()
    count = len(models.examples(kind))
    for index in range(count):
        options = ["--max-batch-size", str(models.MAX_BATCH_SIZE[kind]), *([] if fmt is None else ["--format", fmt])]
        done = runner.invoke(app, ["export", f"tests.exporter.branching_models:{kind}_model", "--name", "m",
                                   "--repository", str(repo), *options],
                             env={models.EXAMPLE_VARIABLE: str(index)})

        assert done.exit_code == 0, done.output
        assert f"m version {index + 1}" in done.stdout
    result = export(models.build(kind), models.examples(kind)[0], name="m", repository=repo,
                    format=fmt or "onnx", max_batch_size=models.MAX_BATCH_SIZE[kind])  # type: ignore[arg-type]
    for version in range(1, count + 2):
        published = ExportResult(**{**result.__dict__, "model_dir": repo / "m" / str(version)})
        assert_right_each_way(published, kind)
