"""``max_batch_size=0``: a model without a batch dim (a set of items, fixed-shape singletons) is exported as Triton
serves one: ``max_batch_size: 0``, dims that are the whole shapes (``-1`` where the user declared an axis dynamic),
no dynamic batcher, and a parity gate on the examples' own shapes (declared dynamic axes grown), with no batch sizes
and no row-independence check, which exist only because a batcher concatenates rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from exporter import (
    DynamicBatchError,
    InvalidSpecError,
    ModelError,
    RepositoryError,
    RowDependenceError,
    export,
)
from exporter.model_config import read_config
from exporter.module_io import ExampleInputs
from exporter.parity import OutputParity, ParityReport
from exporter.specs import Format
from services.modelrepo.manifest import read_manifest
from tests.exporter.helpers import listing
from tests.unbatched_models import ITEMS, ScaledSum, set_example, set_pooler

FORMATS: tuple[Format, ...] = ("onnx", "torchscript")


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("preferred_batch_sizes", [2], r"preferred_batch_sizes=\[2\] \(--preferred-batch-size\)"),
        ("priority_levels", 2, r"priority_levels=2 \(--priority-levels\)"),
        ("max_queue_delay_us", 100, r"max_queue_delay_us=100 \(--max-queue-delay-us\)"),
    ],
)
def test_export_refuses_batcher_options_when_max_batch_size_is_0(
    repo: Path, option: str, value: object, named: str
) -> None:
    with pytest.raises(InvalidSpecError, match=named + r" configure the dynamic batcher, but max_batch_size=0 exports "
                       r"a model without a batch dim.*leave them out, or give max_batch_size of 1 or more"):
        export(set_pooler(), set_example(), name="sets", repository=repo, max_batch_size=0,
               **{option: value})  # type: ignore[arg-type]

    assert listing(repo) == []


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_writes_whole_shapes_without_batcher_when_max_batch_size_is_0(repo: Path, fmt: Format) -> None:
    example = set_example()
    model = set_pooler()
    # Batched, axis 0 would be the batch, which the pooled output does not keep: refused, pointing here.
    with pytest.raises(DynamicBatchError, match=r"has shape \(3,\) for a batch of 5.*exports with max_batch_size=0"):
        export(model, example, name="sets", repository=repo, format=fmt, max_batch_size=8)

    result = export(model, example, name="sets", repository=repo, format=fmt, max_batch_size=0,
                    dynamic_axes={"x": [0]})

    text = result.config_path.read_text()
    assert "max_batch_size: 0\n" in text  # written out, though protobuf would leave a zero out
    config = read_config(repo / "sets")
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert [(list(t.dims), t.HasField("reshape")) for t in (*config.input, *config.output)] == [
        ([-1, 4], False), ([3], False), ([-1], False)]
    sample = config.model_warmup[0]
    name = config.input[0].name
    assert sample.batch_size == 1
    assert list(sample.inputs[name].dims) == [ITEMS, 4]  # the whole example, not one row of it
    assert (repo / "sets" / "warmup" / name).read_bytes() == example.numpy().tobytes()
    # The gate fed the example's shape and grew the declared axis 0, with no batch sizes: 5, 6 and 7 items.
    assert result.parity.batch_sizes == (0, 0, 0)
    assert result.parity.input_shapes == (((5, 4),), ((6, 4),), ((7, 4),))
    manifest = read_manifest(result.model_dir)
    assert manifest.max_batch_size == 0
    assert manifest.parity["batch_sizes"] == [0, 0, 0]
    samples = np.load(result.model_dir / "samples" / "inputs.npz")
    assert samples[name].shape == (ITEMS, 4)
    if fmt == "onnx":
        graph = onnx.load(str(result.model_dir / "model.onnx")).graph
        axis = graph.input[0].type.tensor_type.shape.dim[0]
        assert axis.dim_param  # dynamic, as declared


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_declares_fixed_whole_shapes_when_max_batch_size_is_0_without_dynamic_axes(
    repo: Path, fmt: Format
) -> None:
    result = export(ScaledSum(), (torch.randn(3, 4), torch.tensor([2.0])), name="scaled", repository=repo,
                    format=fmt, max_batch_size=0)

    config = read_config(repo / "scaled")
    assert [(list(t.dims), t.HasField("reshape")) for t in (*config.input, *config.output)] == [
        ([3, 4], False), ([1], False), ([1], False)]
    assert result.parity.input_shapes == (((3, 4), (1,)),)  # no dynamic axis: the examples' own shapes, once
    if fmt == "onnx":
        graph = onnx.load(str(result.model_dir / "model.onnx")).graph
        assert [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in (*graph.input, *graph.output)] == [
            [3, 4], [1], [1]]  # nothing dynamic that was not declared


class ScalarIn(nn.Module):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x * t


class ScalarOut(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


@pytest.mark.parametrize(
    ("model", "example", "named"),
    [
        (ScalarIn(), (torch.randn(3), torch.tensor(2.0)), "input 't' is a scalar"),
        (ScalarOut(), torch.randn(3), "output 'output' is a scalar"),
    ],
)
def test_export_refuses_scalars_naming_the_tensor_when_max_batch_size_is_0(
    repo: Path, model: nn.Module, example: ExampleInputs, named: str
) -> None:
    # Triton refuses to load such a config ("cannot have empty reshape for non-batching model as scalar tensors are
    # not supported"), seen on the local Triton: refused here, before minutes of exporting.
    with pytest.raises(ModelError) as raised:
        export(model, example, name="scalar", repository=repo, max_batch_size=0)

    message = " ".join(str(raised.value).split())
    assert f"{named} (shape ()), and Triton serves no scalar tensor in a model without a batch dim" in message
    assert "Give it shape (1,) instead" in message
    assert listing(repo) == []


class SoftmaxOverItems(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=0)


@pytest.mark.slow  # exports models
def test_export_skips_the_row_independence_check_when_max_batch_size_is_0(repo: Path) -> None:
    with pytest.raises(RowDependenceError):  # batched, a batcher would mix different clients' rows
        export(SoftmaxOverItems(), torch.randn(5, 4), name="items", repository=repo, max_batch_size=8)

    # Unbatched, axis 0 holds one request's items: no batcher concatenates requests along it.
    result = export(SoftmaxOverItems(), torch.randn(5, 4), name="items", repository=repo, max_batch_size=0)

    assert result.parity.passed
    assert result.parity.input_shapes == (((5, 4),),)


class FixedSet(nn.Module):
    """Takes exactly five items, whatever dynamic_axes claims."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(5, 4).sum(0)


@pytest.mark.slow  # exports a model
def test_export_names_dynamic_axes_not_batch_sizes_when_an_unbatched_forward_fails_at_a_grown_axis(repo: Path) -> None:
    with pytest.raises(ModelError) as raised:
        export(FixedSet(), torch.randn(5, 4), name="fixed", repository=repo, format="torchscript", max_batch_size=0,
               dynamic_axes={"x": [0]})

    message = " ".join(str(raised.value).split())
    assert "on inputs of shapes x [6, 4] float32" in message
    assert "every length of a dynamic axis" in message
    assert "leave the axis out of dynamic_axes" in message
    assert "batch" not in message.split("which the parity gate fed it")[1]  # no batch sizes to blame
    assert listing(repo) == []


@pytest.mark.slow  # exports models
def test_export_refuses_an_unbatched_version_when_the_model_batches(repo: Path) -> None:
    # A set of 4-vectors (5, 4) and a batch of them (batch, 4) both declare dims [4]: only the batch dim differs.
    export(nn.Linear(4, 3), torch.randn(2, 4), name="linear", repository=repo, input_names=["x"],
           output_names=["y"])
    before = listing(repo)

    with pytest.raises(RepositoryError) as raised:
        export(nn.Linear(4, 3), torch.randn(4), name="linear", repository=repo, input_names=["x"],
               output_names=["y"], max_batch_size=0)

    message = " ".join(str(raised.value).split())
    assert ("batch dim: max_batch_size 32 (dims without the batch dim) there, max_batch_size 0 (no batch dim, dims "
            "are whole shapes) here") in message
    assert listing(repo) == before


def test_parity_failure_names_whole_tensors_when_the_model_has_no_batch_dim() -> None:
    failed = OutputParity("pooled", 0, 0.5, 0.5, 1e-4, 1e-4, False, "like the example", 0.5, 1.0)

    text = ParityReport((0,), (failed,)).failures_text()

    assert text.startswith("pooled @ whole tensors (no batch dim), inputs like the example: max abs 0.5")
