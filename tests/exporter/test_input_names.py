"""Served input names: forward's parameter names by default, the user's when given, Triton's for TorchScript."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from exporter import InvalidSpecError, export
from exporter.module_io import prepare
from services.modelrepo.manifest import read_manifest
from tests.exporter.helpers import listing

pytestmark = pytest.mark.slow  # exports models


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 4)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embedding(tokens) * mask.unsqueeze(-1)
        return out


class VarArgs(nn.Module):
    def forward(self, first: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return first + sum(rest, torch.zeros_like(first))


class Echo(nn.Module):
    def forward(self, output: torch.Tensor) -> torch.Tensor:
        return output * 2


def masked_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 20, (2, 6)), torch.ones(2, 6)


def onnx_input_names(model_dir: Path) -> list[str]:
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    return [i.name for i in session.get_inputs()]


def test_export_names_onnx_inputs_after_forward_parameters_when_inputs_are_positional(repo: Path) -> None:
    sequence = {1: "sequence"}
    result = export(Masked().eval(), masked_inputs(), name="m", repository=repo,
                    dynamic_axes={"tokens": sequence, "mask": sequence})

    assert [(s.name, s.dims) for s in result.inputs] == [("tokens", (-1,)), ("mask", (-1,))]
    assert onnx_input_names(result.model_dir) == ["tokens", "mask"]
    assert [o.name for o in result.outputs] == ["output"]


def test_export_keeps_given_names_when_input_names_override_forward(repo: Path) -> None:
    result = export(Masked().eval(), masked_inputs(), name="m", repository=repo, input_names=["ids", "keep"])

    assert onnx_input_names(result.model_dir) == ["ids", "keep"]


def test_export_names_inputs_by_position_when_forward_takes_them_as_varargs(repo: Path) -> None:
    result = export(VarArgs(), (torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)), name="m", repository=repo)

    assert onnx_input_names(result.model_dir) == ["first", "input__1", "input__2"]


def test_export_keeps_triton_names_and_records_forward_names_when_format_is_torchscript(repo: Path) -> None:
    result = export(Masked().eval(), masked_inputs(), name="m", repository=repo, format="torchscript")

    assert [s.name for s in result.inputs] == ["INPUT__0", "INPUT__1"]
    assert [e.source for e in read_manifest(result.model_dir).inputs] == ["tokens", "mask"]


def test_export_refuses_input_named_like_an_output_when_format_is_onnx(repo: Path) -> None:
    with pytest.raises(InvalidSpecError, match=r"\['output'\] would name both an input and an output.*input_names"):
        export(Echo(), torch.randn(2, 3), name="m", repository=repo)
    assert listing(repo) == []

    renamed = export(Echo(), torch.randn(2, 3), name="m", repository=repo, input_names=["x"])
    torchscript = export(Echo(), torch.randn(2, 3), name="m_ts", repository=repo, format="torchscript")

    session = ort.InferenceSession(str(renamed.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": np.ones((1, 3), np.float32)})[0], 2.0)
    assert torchscript.max_abs_error == 0.0


class Weighted(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b * 0.001


def test_export_binds_inputs_by_name_when_input_names_are_forward_parameters_in_another_order(repo: Path) -> None:
    result = export(Weighted(), (torch.randn(2, 4), torch.randn(2, 4)), name="m", repository=repo,
                    input_names=["b", "a"])

    session = ort.InferenceSession(str(result.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    answer = session.run(None, {"a": np.ones((1, 4), np.float32), "b": np.zeros((1, 4), np.float32)})[0]
    np.testing.assert_allclose(answer, 2.0)  # eager forward(a=1, b=0)
    assert onnx_input_names(result.model_dir) == ["b", "a"]


@pytest.mark.parametrize(("names", "reached"),
                         [(["b", "x"], "'b' would reach 'a'"), (["x", "a"], "'a' would reach 'b'")])
def test_prepare_refuses_input_names_when_a_parameter_name_would_reach_another_parameter(
    names: list[str], reached: str
) -> None:
    with pytest.raises(InvalidSpecError, match=rf"name parameters of forward\(a, b\) other than the ones their "
                                               rf"tensors reach \({reached}\)"):
        prepare(Weighted(), (torch.randn(2, 4), torch.randn(2, 4)), input_names=names)


def test_prepare_refuses_input_names_when_they_swap_the_keys_of_dict_examples() -> None:
    with pytest.raises(InvalidSpecError, match=r"'b' would reach 'a', 'a' would reach 'b'.*example dict's keys"):
        prepare(Weighted(), {"a": torch.randn(2, 4), "b": torch.randn(2, 4)}, input_names=["b", "a"])
