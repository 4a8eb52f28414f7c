"""One module instance exported again and again in one process (a notebook) behaves as in a fresh process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from google.protobuf import text_format
from torch import nn
from tritonclient.grpc import model_config_pb2 as mc

from exporter import export

pytestmark = pytest.mark.slow


class Tagger(nn.Module):
    def __init__(self, recurrent: type[nn.LSTM] | type[nn.GRU]) -> None:
        super().__init__()
        self.rnn = recurrent(4, 8, batch_first=True)
        self.tags = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(x)
        scores: torch.Tensor = self.tags(states)
        return scores


SCALE = 2.0


class Scaled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * SCALE  # torch.jit.script cannot read a module global: the export falls back to a trace


class Unscriptable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x) + 1
        return out


def input_dims(config_path: Path) -> list[list[int]]:
    config = text_format.Parse(config_path.read_text(), mc.ModelConfig())
    return [list(t.dims) for t in config.input]


@pytest.mark.parametrize("recurrent", [nn.LSTM, nn.GRU], ids=["lstm", "gru"])
def test_export_keeps_sequence_dynamic_when_the_module_was_exported_with_static_axes_before(
    repo: Path, recurrent: type[nn.LSTM] | type[nn.GRU]
) -> None:
    torch.manual_seed(0)
    model = Tagger(recurrent).eval()
    x = {"x": torch.randn(2, 5, 4)}
    static = export(model, x, name="static", repository=repo)

    dynamic = export(model, x, name="dynamic", repository=repo, dynamic_axes={"x": [1]})

    assert input_dims(static.config_path) == [[5, 4]]
    assert input_dims(dynamic.config_path) == [[-1, 4]]  # as a fresh process exports it
    assert {s[0][1] for s in dynamic.parity.input_shapes} == {5, 6, 7}  # the gate ran other lengths


def test_export_names_the_real_scripting_error_when_the_module_failed_to_script_before(repo: Path) -> None:
    model = Unscriptable().eval()
    first = export(model, torch.randn(3, 4), name="first", repository=repo, format="torchscript")

    second = export(model, torch.randn(3, 4), name="second", repository=repo, format="torchscript")

    assert first.exporter == second.exporter == "torch.jit.trace"
    assert any("closed over global variable" in note for note in first.notes)
    assert second.notes == first.notes  # not "Can't redefine method: forward on class Scaled"


def test_export_matches_fresh_process_results_when_one_module_goes_through_every_format_and_precision(
    repo: Path,
) -> None:
    torch.manual_seed(0)
    model = Tagger(nn.LSTM).eval()
    x = torch.randn(2, 5, 4)
    results = [export(model, {"x": x}, name="fp32_onnx", repository=repo, dynamic_axes={"x": [1]}),
               export(model, {"x": x}, name="fp32_ts", repository=repo, format="torchscript")]
    model.half()
    results += [export(model, {"x": x.half()}, name="fp16_ts", repository=repo, format="torchscript"),
                export(model.float(), {"x": x}, name="fp32_onnx_again", repository=repo, dynamic_axes={"x": [1]})]

    assert [r.exporter for r in results] == ["torch.onnx.dynamo", "torch.jit.script", "torch.jit.script",
                                             "torch.onnx.dynamo"]
    assert [r.inputs[0].datatype for r in results] == ["FP32", "FP32", "FP16", "FP32"]
    assert [r.parity.checks[0].atol for r in results] == [1e-4, 1e-4, 1e-2, 1e-4]
    assert input_dims(results[0].config_path) == input_dims(results[3].config_path) == [[-1, 4]]


class Doubles(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_export_leaves_the_users_scripted_modules_working_when_it_resets_torch_caches(repo: Path) -> None:
    scripted = torch.jit.script(Doubles())

    export(Unscriptable().eval(), torch.randn(3, 4), name="m", repository=repo, format="torchscript")

    torch.testing.assert_close(scripted(torch.ones(2)), torch.full((2,), 2.0))
    torch.testing.assert_close(torch.jit.script(Doubles())(torch.ones(2)), torch.full((2,), 2.0))
