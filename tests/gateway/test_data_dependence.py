"""Which models' run time can follow their input values: those never run on the event loop's thread."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from services.gateway.backends.data_dependence import onnx_data_dependent_ops, torchscript_data_dependent_kinds


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


def test_onnx_loop_with_an_input_trip_count_is_found(tmp_path: Path) -> None:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["x_in"], ["x_out"])],
        "step",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["n", 4])],
    )
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
        helper.make_node("Cast", ["peak"], ["trips"], to=TensorProto.INT64),  # how often: a value of the input
        helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body),
    ]
    path = _save(tmp_path / "loop.onnx", nodes, [helper.make_tensor("keep_going", TensorProto.BOOL, [], [True])])
    assert onnx_data_dependent_ops(path) == {"Loop"}


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
