"""The zoo runner on its own: refusals recorded with their cause, departures from the catalog reported, and
the table ``make zoo`` prints. The whole zoo is exported and served in tests/integration/test_zoo_serving.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from examples.zoo import ZOO, ZooRow, export_zoo, problems
from examples.zoo.run import markdown_table, parity_text
from exporter import UnsupportedOperatorError
from exporter.parity import OutputParity, ParityReport

BINNED = next(m for m in ZOO if m.name == "binned_scorer")


@pytest.fixture(scope="module")
def binned_rows(tmp_path_factory: pytest.TempPathFactory) -> list[ZooRow]:
    return export_zoo(tmp_path_factory.mktemp("zoo"), [BINNED])


@pytest.mark.slow
def test_export_zoo_records_refusal_naming_the_operator_when_onnx_cannot_carry_the_model(
    binned_rows: list[ZooRow],
) -> None:
    onnx, torchscript = binned_rows

    assert onnx.result is None
    assert isinstance(onnx.refusal, UnsupportedOperatorError)
    assert onnx.refusal.operator == "aten.searchsorted"
    assert torchscript.result is not None
    assert torchscript.result.exporter == "torch.jit.script"
    assert problems(binned_rows) == []
    table = markdown_table(binned_rows)
    assert "| binned_scorer | onnx | refused | UnsupportedOperatorError: neither ONNX exporter can convert the " \
           "operator aten.searchsorted |" in table
    assert "| binned_scorer | torchscript | torch.jit.script | 1: 0.0e+00, 7: 0.0e+00, 8: 0.0e+00 |" in table


@pytest.mark.slow
def test_problems_reports_departures_when_the_catalog_expects_otherwise(binned_rows: list[ZooRow]) -> None:
    onnx, torchscript = binned_rows
    unexpected = dataclasses.replace(BINNED, refused={})
    other_cause = dataclasses.replace(BINNED, refused={"onnx": "aten.bucketize"})
    expects_both = dataclasses.replace(BINNED, refused={"onnx": "aten.searchsorted", "torchscript": "anything"})

    assert problems([dataclasses.replace(onnx, model=unexpected)])[0].startswith(
        "binned_scorer_onnx was refused: neither ONNX exporter")
    assert problems([dataclasses.replace(onnx, model=other_cause)])[0].startswith(
        "binned_scorer_onnx was refused without naming 'aten.bucketize'")
    assert problems([dataclasses.replace(row, model=expects_both) for row in binned_rows]) == [
        "binned_scorer_torchscript exported, but the catalog expects a refusal naming 'anything'",
    ]
    assert problems([onnx]) == ["no format carries binned_scorer"]
    assert problems([torchscript]) == []


def test_parity_text_shows_each_dynamic_size_when_the_gate_grew_an_axis() -> None:
    checks = tuple(OutputParity(name, batch, error, 0.0, 1e-4, 1e-4, True)
                   for batch, error in ((1, 1e-7), (7, 2e-7), (8, 3e-7)) for name in ("a", "b"))
    shapes = (((1, 6), (1, 4)), ((7, 7), (7, 4)), ((8, 8), (8, 4)))

    assert parity_text(ParityReport((1, 7, 8), checks, shapes)) == "1/6: 1.0e-07, 7/7: 2.0e-07, 8/8: 3.0e-07"
    static = tuple(((b, 4),) for b in (1, 7, 8))
    assert parity_text(ParityReport((1, 7, 8), checks, static)) == "1: 1.0e-07, 7: 2.0e-07, 8: 3.0e-07"


@pytest.mark.slow
def test_zoo_command_prints_the_table_and_succeeds_when_the_zoo_matches_its_catalog() -> None:
    done = subprocess.run([sys.executable, "-m", "examples.zoo", "--model", "two_heads"], capture_output=True,
                          text=True, cwd=Path(__file__).parents[2], timeout=300, check=False)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Exporter model zoo" in done.stdout
    assert "two_heads_onnx: exported" in done.stdout
    assert "2 exports in" in done.stdout
