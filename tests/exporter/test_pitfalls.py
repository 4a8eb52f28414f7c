"""Each pitfall, triggered by a real module: a clear ExportError, or correct handling."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from torch import nn
from tritonclient.grpc import model_config_pb2 as mc

from exporter import (
    DataDependentControlFlowError,
    DynamicBatchError,
    InvalidSpecError,
    ModelError,
    ParityError,
    UnsupportedOperatorError,
    export,
)
from services.modelrepo.layout import SAMPLE_INPUTS_FILE
from services.modelrepo.manifest import read_samples
from tests.exporter.helpers import listing


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class SumsOverBatch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=0, keepdim=True)


class FixedBatchView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(4, -1) * 2


class Eigenvalues(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigvalsh(x @ x.transpose(-1, -2))


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("expected 3 channels")


class KwargsOnly(nn.Module):
    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return inputs["ids"].float() * 2 + inputs["mask"].float()


class ListOutputs(nn.Module):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x + 1, x * 2]


class Transposes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


class LenBranch(nn.Module):
    """Unscriptable (**kw) with a shape-dependent branch: a trace would freeze the branch it saw."""

    def forward(self, x: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
        if len(x) > 2:
            return x * 2
        return x + 1


class CountsCalls(nn.Module):
    """Python-side state: eager answers change from call to call, an exported graph cannot."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.calls


def test_export_refuses_output_when_batch_axis_is_reduced(repo: Path) -> None:
    with pytest.raises(DynamicBatchError, match="output 'output' has shape \\(1, 8\\)"):
        export(SumsOverBatch(), torch.randn(4, 8), name="m", repository=repo)
    assert listing(repo) == []


@pytest.mark.slow  # exports models
def test_export_refuses_output_when_batch_axis_comes_out_static(repo: Path) -> None:
    with pytest.raises(DynamicBatchError, match="fixed batch axis \\(size 4\\)"):
        export(FixedBatchView(), torch.randn(4, 3), name="m", repository=repo)
    assert listing(repo) == []


@pytest.mark.slow  # exports models
def test_export_names_operator_when_no_exporter_can_convert_it(repo: Path) -> None:
    with pytest.raises(UnsupportedOperatorError, match="linalg_eigh") as caught:
        export(Eigenvalues(), torch.randn(4, 3, 3), name="m", repository=repo)
    assert "linalg_eigh" in caught.value.operator
    assert "format='torchscript'" in str(caught.value)
    assert listing(repo) == []


def test_export_refuses_model_when_qat_modules_remain(repo: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 4))
    model.qconfig = torch.ao.quantization.QConfig(  # type: ignore[assignment]
        activation=torch.ao.quantization.FakeQuantize.with_args(observer=torch.ao.quantization.MinMaxObserver),
        weight=torch.ao.quantization.default_weight_fake_quant,
    )
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.ao.quantization.prepare_qat(model.train(), inplace=True)

    with pytest.raises(ModelError, match="quantization-aware-training modules") as caught:
        export(model, torch.randn(2, 8), name="m", repository=repo)
    assert "torch.ao.quantization.convert" in str(caught.value)
    assert listing(repo) == []


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_declares_fp16_when_model_is_half_precision(repo: Path, fmt: str) -> None:
    torch.manual_seed(0)
    result = export(Linear().half(), torch.randn(3, 8).half(), name=f"half_{fmt}", repository=repo,
                    format=fmt)  # type: ignore[arg-type]

    config = text_format.Parse(result.config_path.read_text(), mc.ModelConfig())
    assert config.input[0].data_type == mc.TYPE_FP16
    assert config.output[0].data_type == mc.TYPE_FP16
    assert result.parity.checks[0].atol == 1e-2


class Bfloat16Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.float()).to(torch.bfloat16)


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_serves_bf16_when_model_takes_and_returns_bfloat16(repo: Path, fmt: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4).bfloat16()

    result = export(Bfloat16Head().eval(), x, name=f"bf16_{fmt}", repository=repo, format=fmt,  # type: ignore[arg-type]
                    max_batch_size=4)

    config = text_format.Parse(result.config_path.read_text(), mc.ModelConfig())
    assert (config.input[0].data_type, config.output[0].data_type) == (mc.TYPE_BF16, mc.TYPE_BF16)
    assert result.parity.passed
    # Triton reads BF16 raw data as 2 bytes per element: the bit pattern of the example's first row
    warmup = result.model_dir.parent / "warmup" / config.input[0].name
    assert warmup.read_bytes() == x[:1].view(torch.int16).numpy().tobytes()
    samples = read_samples(result.model_dir, SAMPLE_INPUTS_FILE)
    np.testing.assert_array_equal(samples[config.input[0].name], x.float().numpy())  # bf16 values kept exactly


class ScalesInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.fc(x)


def test_export_names_in_place_change_when_forward_changes_its_input(repo: Path) -> None:
    x = torch.randn(2, 4)
    before = x.clone()

    with pytest.raises(ModelError, match=r"forward changes its input 'x' in place .*x = x \* 2"):
        export(ScalesInPlace(), x, name="m", repository=repo)
    assert torch.equal(x, before)  # the caller's tensor is left alone
    assert listing(repo) == []


@pytest.mark.slow  # exports models
def test_export_flattens_list_outputs_into_named_outputs_in_order(repo: Path) -> None:
    result = export(ListOutputs(), torch.randn(2, 5), name="m", repository=repo)

    assert [o.name for o in result.outputs] == ["output__0", "output__1"]
    session = ort.InferenceSession(str(result.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.ones((3, 5), np.float32)
    plus_one, times_two = session.run(["output__0", "output__1"], {"x": x})
    np.testing.assert_allclose(plus_one, x + 1)
    np.testing.assert_allclose(times_two, x * 2)


@pytest.mark.slow  # exports models
def test_export_serves_kwargs_forward_when_inputs_are_named(repo: Path) -> None:
    inputs = {"ids": torch.randint(0, 5, (2, 6)), "mask": torch.ones(2, 6, dtype=torch.int64)}
    result = export(KwargsOnly(), inputs, name="m", repository=repo)

    assert [(i.name, i.datatype) for i in result.inputs] == [("ids", "INT64"), ("mask", "INT64")]


def test_export_explains_kwargs_forward_when_inputs_are_positional(repo: Path) -> None:
    with pytest.raises(ModelError, match=r"forward\(\*\*kwargs\).*Pass example_inputs as a dict"):
        export(KwargsOnly(), (torch.ones(2, 6),), name="m", repository=repo)


def test_export_names_keyword_only_parameter_when_examples_are_positional(repo: Path) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        export(KeywordOnlyBias(), (torch.randn(2, 4), torch.randn(2, 3)), name="m", repository=repo)

    message = str(caught.value)
    assert message.startswith("forward(x, *, bias) takes 'bias' by keyword only, but the example inputs are "
                              "positional")
    assert "Pass example_inputs as a dict keyed by parameter name, e.g. {'x': ..., 'bias': ...}" in message
    assert listing(repo) == []


def test_export_wraps_error_when_forward_raises(repo: Path) -> None:
    with pytest.raises(ModelError, match="forward raised ValueError: expected 3 channels") as caught:
        export(Raises(), torch.randn(2, 4), name="m", repository=repo)
    assert isinstance(caught.value.__cause__, ValueError)
    assert listing(repo) == []


def test_export_refuses_model_when_it_spans_devices(repo: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    model[1].to("meta")

    with pytest.raises(ModelError, match="more than one device") as caught:
        export(model, torch.randn(2, 8), name="m", repository=repo)
    assert "meta" in str(caught.value)
    assert "cpu" in str(caught.value)


@pytest.mark.slow  # exports models
def test_export_handles_input_when_it_is_not_contiguous(repo: Path) -> None:
    transposed = torch.randn(8, 4).t()
    assert not transposed.is_contiguous()

    result = export(Transposes(), transposed, name="m", repository=repo)

    assert result.max_abs_error < 1e-5
    assert any("not contiguous" in note for note in result.notes)


@pytest.mark.slow  # exports models
def test_export_refuses_trace_when_it_would_freeze_a_len_branch(repo: Path) -> None:
    with pytest.raises(DataDependentControlFlowError, match=r"if len\(x\) > 2") as caught:
        export(LenBranch(), torch.randn(4, 3), name="m", repository=repo, format="torchscript")
    assert "torch.where" in str(caught.value)
    assert caught.value.locations[0].endswith("if len(x) > 2:")
    assert listing(repo) == []


@pytest.mark.slow  # exports models
def test_export_reports_parity_failure_when_export_is_unfaithful(repo: Path) -> None:
    with pytest.raises(ParityError, match=r"output @ batch \d+, inputs [^:]+: max abs") as caught:
        export(CountsCalls(), torch.randn(4, 3), name="m", repository=repo)
    assert "tolerance atol=0.0001, rtol=0.0001" in str(caught.value)
    assert "1) forward() itself answers differently on the same inputs" in str(caught.value)
    assert listing(repo) == []


@pytest.mark.slow  # exports models
def test_export_puts_model_back_in_training_mode_when_it_was_training(repo: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.Dropout(0.5)).train()

    result = export(model, torch.randn(2, 8), name="m", repository=repo)

    assert model.training
    assert result.max_abs_error < 1e-4


@pytest.mark.slow  # exports a model
def test_export_restores_each_submodules_mode_when_modes_are_mixed(repo: Path) -> None:
    # training with a frozen batch-norm, and an eval-mode block with a dropout left on
    model = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Sequential(nn.Dropout(0.5))).train()
    model[1].eval()
    model[2].eval()
    model[2][0].train()
    modes = [m.training for m in model.modules()]

    export(model, torch.randn(2, 8), name="m", repository=repo, format="torchscript")

    assert [m.training for m in model.modules()] == modes


class CountsInABuffer(nn.Module):
    """Writes its own state in forward (a call counter, a running average): the export runs forward many times."""

    calls: torch.Tensor
    seen: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen = self.seen + x.detach().abs().mean(0)  # replaces the buffer, not only its values
        with torch.no_grad():
            self.fc.bias.mul_(1.0)  # a write to a parameter that leaves its values
        out: torch.Tensor = self.fc(x)
        return out


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_leaves_buffers_and_parameters_unchanged_when_forward_writes_them(repo: Path, fmt: str) -> None:
    torch.manual_seed(0)
    model = CountsInABuffer()
    before = {name: t.detach().clone() for name, t in model.state_dict().items()}
    objects = {name: id(t) for name, t in [*model.named_buffers(), *model.named_parameters()]}

    export(model, torch.randn(2, 8), name="m", repository=repo, format=fmt)  # type: ignore[arg-type]

    after = model.state_dict()
    assert int(after["calls"]) == 0
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0, msg=name)
    assert {name: id(t) for name, t in [*model.named_buffers(), *model.named_parameters()]} == objects


class MeanEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 16)

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        vectors = self.embedding(tokens)
        return {"pooled": vectors.mean(dim=1), "per_token": vectors}


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_keeps_extra_axes_dynamic_when_dynamic_axes_given(repo: Path, fmt: str) -> None:
    tokens = torch.randint(0, 50, (2, 6))

    result = export(MeanEmbedding().eval(), {"tokens": tokens}, name=f"emb_{fmt}", repository=repo,
                    format=fmt, dynamic_axes={"tokens": [1]})  # type: ignore[arg-type]

    config = text_format.Parse(result.config_path.read_text(), mc.ModelConfig())
    assert [list(t.dims) for t in config.input] == [[-1]]
    assert [list(t.dims) for t in config.output] == [[16], [-1, 16]]
    # parity ran at other sequence lengths than the example's 6
    assert result.parity.passed


class BatchStatistics(nn.Module):
    """Normalises with the batch's own statistics even in eval mode: a batch of one row cannot be normalised."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(x)
        return out


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_export_names_the_sizes_when_forward_raises_at_a_batch_size_the_gate_feeds(repo: Path, fmt: str) -> None:
    # The example's batch of 2 runs; batch 1, which any client may send, raises in eager PyTorch.
    with pytest.raises(ModelError, match=r"forward raised ValueError: Expected more than 1 value per channel .* on "
                                         r"inputs of shapes x \[1, 4\] float32, which the parity gate fed it because "
                                         r"a client may send them") as caught:
        export(BatchStatistics(), torch.randn(2, 4), name="m", repository=repo, format=fmt,  # type: ignore[arg-type]
               max_batch_size=8)
    assert isinstance(caught.value.__cause__, ValueError)
    assert "a smaller max_batch_size" in str(caught.value)
    assert listing(repo) == []


@pytest.mark.parametrize("shape", [(0, 4), (2, 0)])
def test_export_refuses_example_when_it_holds_no_values(repo: Path, shape: tuple[int, int]) -> None:
    with pytest.raises(InvalidSpecError, match=rf"example inputs x \[{shape[0]}, {shape[1]}\] hold no values \(a dim "
                                               r"of size 0\): give at least one row"):
        export(Linear(), torch.randn(*shape), name="m", repository=repo)
    assert listing(repo) == []


class KeywordOnlyBias(nn.Module):
    """Scriptable, but a trace of the flat adapter cannot call the scripted forward's keyword-only parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x) + bias
        return out


class NestedOutputs(nn.Module):
    """Scriptable (as ``Any``), but its dict of mixed values cannot come out of a trace around the scripted module."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.fc(x)
        return {"scores": y, "extra": (y + 1, {"doubled": y * 2})}


@pytest.mark.slow  # exports models
def test_export_traces_torchscript_when_the_scripted_module_cannot_be_traced(repo: Path) -> None:
    torch.manual_seed(0)
    keyword = KeywordOnlyBias().eval()
    nested = NestedOutputs().eval()

    results = [export(keyword, {"x": torch.randn(2, 4), "bias": torch.randn(2, 3)}, name="keyword", repository=repo,
                      format="torchscript"),
               export(nested, torch.randn(2, 4), name="nested", repository=repo, format="torchscript")]

    assert [r.exporter for r in results] == ["torch.jit.trace", "torch.jit.trace"]
    assert all("the scripted module could not be traced" in " ".join(r.notes) for r in results)
    served = [torch.jit.load(str(r.model_dir / "model.pt")) for r in results]  # type: ignore[no-untyped-call]
    x, bias = torch.randn(5, 4), torch.randn(5, 3)
    with torch.no_grad():
        torch.testing.assert_close(served[0](x, bias)[0], keyword(x, bias=bias))
        expected = nested(x)
        torch.testing.assert_close(list(served[1](x)),
                                   [expected["scores"], expected["extra"][0], expected["extra"][1]["doubled"]])


class IgnoresTokenTypes(nn.Module):
    """Takes token_type_ids for its signature's sake and never reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 4)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embedding(input_ids).mean(dim=1)
        return out


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("how", ["scripted", "opset 11"])
def test_export_keeps_an_unused_input_when_the_torchscript_based_onnx_exporter_writes_the_file(
    repo: Path, how: str
) -> None:
    torch.manual_seed(0)
    model = IgnoresTokenTypes().eval()
    ids = torch.randint(0, 20, (2, 6))
    # A ScriptModule, or an opset torch.export's exporter cannot write: the TorchScript-based exporter runs.
    module, opset = (torch.jit.script(model), None) if how == "scripted" else (model, 11)

    result = export(module, (ids, torch.zeros_like(ids)), name="m", repository=repo, opset=opset)

    assert result.exporter == "torch.onnx.torchscript"
    assert [i.name for i in result.inputs] == ["input_ids", "token_type_ids"]
    session = ort.InferenceSession(str(result.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "token_type_ids"]
    fresh = torch.randint(0, 20, (5, 6))
    answer = session.run(None, {"input_ids": fresh.numpy(), "token_type_ids": np.ones((5, 6), np.int64)})[0]
    with torch.no_grad():
        np.testing.assert_allclose(answer, model(fresh, fresh).numpy(), atol=1e-6)
    assert any("never reads 'token_type_ids'" in note for note in result.notes)
