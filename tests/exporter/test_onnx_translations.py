"""The ONNX translation table is built once per process and opset, and again when new operators appear."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.onnx._internal.exporter import _registration

from exporter import export
from exporter.onnx_translations import shared_translations
from tests.exporter.branching_models import example
from tests.exporter.test_pitfalls import Linear


def test_shared_translations_serves_one_table_per_opset_when_nothing_new_is_registered() -> None:
    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    with shared_translations():
        first = _registration.ONNXRegistry().from_torchlib(opset_version=18)
        again = _registration.ONNXRegistry().from_torchlib(opset_version=18)
        other = _registration.ONNXRegistry().from_torchlib(opset_version=19)

    assert again is first
    assert other is not first
    assert other.opset_version == 19
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is original  # torch's own method is back


def test_shared_translations_builds_a_new_table_when_an_import_registers_operators() -> None:
    with shared_translations():
        before = _registration.ONNXRegistry().from_torchlib(opset_version=18)
    library = torch.library.Library("switchyard_translations_test", "DEF")  # what importing torchvision does
    library.define("identity(Tensor x) -> Tensor")
    try:
        with shared_translations():
            after = _registration.ONNXRegistry().from_torchlib(opset_version=18)
    finally:
        library._destroy()

    assert after is not before


@pytest.mark.slow  # exports models
def test_exports_stay_faithful_when_they_share_the_table(repo: Path) -> None:
    torch.manual_seed(0)
    results = [export(Linear().eval(), example(seed)[:, :8], name=f"m{seed}", repository=repo) for seed in range(3)]

    assert [r.exporter for r in results] == ["torch.onnx.dynamo"] * 3
    assert all(r.parity.passed for r in results)
