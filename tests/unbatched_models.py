"""Models without a batch dim (exported with ``max_batch_size=0``), for the exporter's tests and the serving tests
that put its exports behind the gateway (embedded backend and the local Triton).

- ``SetPooler``: a set of items of any count, ``x`` (items, 4), to a pooled (3,) vector and one attention weight
  per item (items,): a softmax over axis 0, so axis 0 is no batch (rows of a batch would answer together);
- ``ScaledSum``: a fixed (3, 4) matrix and a one-element factor in, their scaled sum out, one element: fixed-shape
  singletons (Triton serves no scalar tensor without a batch dim, so one element has shape (1,)).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

ITEMS = 5
"""Items in the example set."""
FEATURES = 4


class Pooled(NamedTuple):
    pooled: torch.Tensor
    weights: torch.Tensor


class SetPooler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(FEATURES, 1)
        self.value = nn.Linear(FEATURES, 3)

    def forward(self, x: torch.Tensor) -> Pooled:
        weights = torch.softmax(self.score(x)[:, 0], dim=0)  # over the set: every item's weight depends on the rest
        return Pooled((weights[:, None] * self.value(x)).sum(0), weights)


class ScaledSum(nn.Module):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (x * t[0]).sum().reshape(1)


def set_pooler() -> SetPooler:
    torch.manual_seed(0)
    return SetPooler().eval()


def set_example(items: int = ITEMS, seed: int = 0) -> torch.Tensor:
    return torch.randn(items, FEATURES, generator=torch.Generator().manual_seed(seed))


def eager(model: nn.Module, *inputs: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    """The model's own answer for whole tensors, as numpy arrays."""
    with torch.no_grad():
        out = model(*(torch.from_numpy(a) for a in inputs))
    tensors = [out] if isinstance(out, torch.Tensor) else list(out)
    return [t.numpy() for t in tensors]
