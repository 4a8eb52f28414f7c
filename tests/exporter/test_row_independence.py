"""A model whose answer for one row depends on the other rows of its batch is never published batched: the served
model's dynamic batcher merges different clients' requests into one batch, so each would get an answer that
depends on its neighbours'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from exporter import RowDependenceError, export
from tests.exporter.helpers import listing

FORMATS = ("onnx", "torchscript")


class SoftmaxOverBatch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=0)


class ScaledByBatchMax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / float(x.abs().max())


class CentredOnBatchMean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0)


class BatchStatisticsOverSequence(nn.Module):
    """A batch norm on the batch's own statistics, eval mode or not; a (batch, channels, length) input lets a batch
    of one row run (unlike (batch, channels)), so only the rows' dependence gives it away."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(3, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(x)
        return out


class RowWise(nn.Module):
    """What the ways out look like: softmax, scaling and centring over each row's own values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = x / x.abs().amax(dim=-1, keepdim=True)
        return torch.softmax(scaled - scaled.mean(dim=-1, keepdim=True), dim=-1)


DEPENDENT = [
    (SoftmaxOverBatch, (4, 5)),
    (ScaledByBatchMax, (4, 5)),
    (CentredOnBatchMean, (4, 5)),
    (BatchStatisticsOverSequence, (4, 3, 6)),
]


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("model", "shape"), DEPENDENT, ids=[m.__name__ for m, _ in DEPENDENT])
def test_export_refuses_model_when_a_rows_answer_depends_on_the_other_rows(
    repo: Path, model: type[nn.Module], shape: tuple[int, ...], fmt: str
) -> None:
    torch.manual_seed(0)
    with pytest.raises(RowDependenceError) as caught:
        export(model(), torch.randn(*shape), name="m", repository=repo, format=fmt,  # type: ignore[arg-type]
               max_batch_size=8)

    message = str(caught.value)
    assert message.startswith("output 'output' of a row depends on the other rows of its batch")
    assert "by up to " in message
    assert "merges requests from different clients" in message
    assert "softmax or a normalisation over dim 0" in message  # what typically causes it
    assert "make forward() row-wise" in message
    assert "max_batch_size=1" in message
    assert listing(repo) == []


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_publishes_model_when_batch_dependence_cannot_reach_another_client(repo: Path, fmt: str) -> None:
    # One row per request: the dynamic batcher never puts two clients' rows into one batch.
    result = export(SoftmaxOverBatch(), torch.randn(1, 5), name="m", repository=repo, format=fmt,  # type: ignore[arg-type]
                    max_batch_size=1)

    assert result.parity.passed


@pytest.mark.slow  # exports models
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_publishes_model_when_forward_is_row_wise(repo: Path, fmt: str) -> None:
    result = export(RowWise(), torch.randn(4, 5), name="m", repository=repo, format=fmt,  # type: ignore[arg-type]
                    max_batch_size=16)

    assert result.parity.passed
    assert result.version == 1
