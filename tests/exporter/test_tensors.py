"""The served tensors' dims: an output dim that follows a dynamic input axis is declared ``-1``, one that follows
the batch size is refused, and a dynamic axis the capture would fix stays dynamic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from google.protobuf import text_format
from onnx import TensorProto, helper
from torch import nn
from tritonclient.grpc import model_config_pb2 as mc

from exporter import DynamicBatchError, ExportError, InvalidSpecError, ParityError, export
from exporter.artifacts import _guarded
from exporter.module_io import prepare
from exporter.parity_device import ON_CPU
from exporter.tensors import tensor_specs
from exporter.torch2onnx import TORCHSCRIPT_ONNX, _check_dynamic_axes
from tests.exporter.helpers import listing


class Gram(nn.Module):
    """Each row's answer mixes in every other row of the batch: (batch, 4) -> (batch, batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y @ y.T


class FirstHalf(nn.Module):
    """(batch, 4, L) -> (batch, 4, L // 2): the same output size at L = 8 and 9, another at 10."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, : x.shape[2] // 2] * 2


class ConvPool(nn.Module):
    """torch.export fixes the sequence axis of this one at the example's length."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x))


def test_export_refuses_output_when_its_dims_follow_the_batch_size(repo: Path) -> None:
    with pytest.raises(DynamicBatchError, match=r"output 'output' has shape \(2, 2\) for a batch of 2 but "
                                                r"\(1, 1\) for a batch of 1: dims past its first follow the batch"):
        export(Gram(), torch.randn(2, 4), name="gram", repository=repo, max_batch_size=8)
    assert listing(repo) == []


def test_tensor_specs_declare_output_dim_dynamic_when_it_follows_a_dynamic_input_axis() -> None:
    prepared = prepare(FirstHalf(), torch.randn(2, 4, 8))

    inputs, outputs = tensor_specs(prepared, ("x",), ("output",), {"x": [2]}, batch_sizes=(1, 7, 8))

    assert inputs[0].dims == (4, -1)
    assert outputs[0].dims == (4, -1)


@pytest.mark.slow  # exports a model
def test_export_keeps_axis_dynamic_when_torch_export_fixes_it_to_the_example_size(repo: Path) -> None:
    torch.manual_seed(0)

    result = export(ConvPool().eval(), torch.randn(2, 4, 8), name="pool", repository=repo, max_batch_size=8,
                    dynamic_axes={"x": [2]})

    assert result.exporter == TORCHSCRIPT_ONNX
    config = text_format.Parse(result.config_path.read_text(), mc.ModelConfig())
    assert [list(t.dims) for t in config.input] == [[4, -1]]
    assert [list(t.dims) for t in config.output] == [[4, -1]]
    assert {shape[0][2] for shape in result.parity.input_shapes} == {8, 9, 10}


def test_onnx_check_names_the_axis_when_the_file_fixes_an_axis_asked_to_be_dynamic() -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["output"])], "pinned",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4, 8])],
    )
    model: onnx.ModelProto = helper.make_model(graph)

    with pytest.raises(ExportError, match=r"axis 2 of input 'x' was asked to be dynamic, but the exported ONNX "
                                          r"graph fixes it at 8 .*format='torchscript'"):
        _check_dynamic_axes(model, {"x": {2: "x_dim2"}}, "torch.onnx.dynamo")


def test_tensor_specs_declare_output_dim_dynamic_when_there_is_one_batch_size() -> None:
    prepared = prepare(FirstHalf(), torch.randn(1, 4, 8))

    _, outputs = tensor_specs(prepared, ("x",), ("output",), {"x": [2]}, batch_sizes=(1,))  # max_batch_size=1

    assert outputs[0].dims == (4, -1)


@pytest.mark.slow  # exports a model
def test_export_grows_dynamic_axes_when_max_batch_size_is_one(repo: Path) -> None:
    torch.manual_seed(0)
    tagger = nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Linear(4, 3))

    result = export(tagger, torch.randint(0, 10, (1, 8)), name="tag", repository=repo, max_batch_size=1,
                    input_names=["tokens"], dynamic_axes={"tokens": [1]})

    config = text_format.Parse(result.config_path.read_text(), mc.ModelConfig())
    assert [list(t.dims) for t in config.output] == [[-1, 3]]
    assert [shape[0] for shape in result.parity.input_shapes] == [(1, 8), (1, 9), (1, 10)]


class TimeMajorLstm(nn.Module):
    """torch.export keeps the sequence axis dynamic at the input, but reshapes to the example's length inside."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x.transpose(0, 1))
        out: torch.Tensor = y.transpose(0, 1)
        return out


@pytest.mark.slow  # exports a model
def test_export_retries_with_torchscript_exporter_when_dynamo_file_fails_at_other_lengths(repo: Path) -> None:
    torch.manual_seed(0)

    result = export(TimeMajorLstm().eval(), torch.randn(3, 6, 4), name="lstm", repository=repo, max_batch_size=8,
                    dynamic_axes={"x": [1]})

    assert result.exporter == TORCHSCRIPT_ONNX
    assert "runs at the example's shapes but not at x [1, 7, 4]" in result.notes[0]
    assert result.parity.passed
    assert {shape[0][1] for shape in result.parity.input_shapes} == {6, 7, 8}


def test_runner_failure_names_the_shapes_and_the_fixed_size_when_other_sizes_fail() -> None:
    prepared = prepare(FirstHalf(), torch.randn(2, 4, 8))

    def failing(inputs: tuple[torch.Tensor, ...]) -> list[Any]:
        raise RuntimeError("Reshape node: input shape {1,4,9}, requested shape {8,-1}")

    run, _ = _guarded("onnxruntime", lambda: (failing, ON_CPU), prepared)

    with pytest.raises(ParityError, match=r"could not run the exported model on inputs of shapes x \[1, 4, 9\]: "
                                          r"RuntimeError: Reshape node.*written from the example inputs "
                                          r"\(x \[2, 4, 8\]\) and fails at other sizes"):
        run((torch.randn(1, 4, 9),))


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_keeps_axis_dynamic_when_dynamic_axes_counts_it_from_the_last(repo: Path, fmt: str) -> None:
    # -1 is the last axis, as torch counts: dynamic in config.pbtxt too, and grown by the parity gate.
    result = export(FirstHalf(), torch.randn(2, 4, 8), name=f"half_{fmt}", repository=repo, max_batch_size=8,
                    format=fmt, dynamic_axes={"x": [-1]})  # type: ignore[arg-type]

    config = text_format.Parse(result.config_path.read_text(), mc.ModelConfig())
    assert [list(t.dims) for t in config.input] == [[4, -1]]
    assert [list(t.dims) for t in config.output] == [[4, -1]]
    assert {shape[0][2] for shape in result.parity.input_shapes} == {8, 9, 10}


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize(("axes", "message"), [
    ({"x": [3]}, r"dynamic_axes gives axis 3 of 'x', which has 3 axes for the example inputs \(batch axis 0 "
                 r"included\): give axes from 1 to 2, or from -3 to -1"),
    ({"output": {-4: "length"}}, r"dynamic_axes gives axis -4 of 'output', which has 3 axes"),
    ({"y": [1]}, r"dynamic_axes names 'y', which is not an input or output of the model: name one of "
                 r"\['output', 'x'\]"),
])
def test_export_refuses_dynamic_axes_when_they_name_no_axis_of_the_model(
    repo: Path, fmt: str, axes: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSpecError, match=message):
        export(FirstHalf(), torch.randn(2, 4, 8), name="half", repository=repo, format=fmt,  # type: ignore[arg-type]
               dynamic_axes=axes)
    assert listing(repo) == []
