"""Which models' run time can follow their input values: those never run on the event loop's thread."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from services.gateway.backends.data_dependence import onnx_data_dependent_ops, torchscript_data_dependent_kinds
from tests.shaping_models import shaping_repository


def _save(path: Path, nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto] | None = None) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=initializers or [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_onnx_graph_of_shape_following_ops_is_steady(tmp_path: Path) -> None:
    path = _save(tmp_path / "plain.onnx", [helper.make_node("Relu", ["x"], ["y"])])
    assert onnx_data_dependent_ops(path) == set()


def test_onnx_graph_names_its_branch_and_data_sized_ops(tmp_path: Path) -> None:
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["out"])], "branch", [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("NonZero", ["x"], ["where"]),
        helper.make_node("If", ["positive"], ["y"], then_branch=branch, else_branch=branch),
    ]
    path = _save(tmp_path / "branchy.onnx", nodes, [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    assert onnx_data_dependent_ops(path) == {"If", "NonZero"}


@pytest.mark.slow
def test_onnx_loop_with_an_input_trip_count_is_found(tmp_path: Path) -> None:
    repository = shaping_repository(tmp_path / "repository")
    assert onnx_data_dependent_ops(repository / "busy" / "1" / "model.onnx") == {"Loop"}
    assert onnx_data_dependent_ops(repository / "heavy" / "1" / "model.onnx") == set()


class _Gated(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            return x * 2
        return x


@pytest.mark.slow
def test_scripted_branch_is_found_and_a_traced_module_is_steady() -> None:
    assert torchscript_data_dependent_kinds(torch.jit.script(_Gated())) == {"prim::If"}
    traced = torch.jit.trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.ones(2, 4))
    assert torchscript_data_dependent_kinds(traced) == set()
