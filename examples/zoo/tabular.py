"""Zoo tabular models: two heads returned as a dict, and a scorer that bins numeric features with
``torch.searchsorted``, an operator no ONNX exporter converts (the ONNX export is refused, naming it)."""

from __future__ import annotations

import torch
from torch import nn


class TwoHeads(nn.Module):
    """A shared trunk over tabular features; a category head and a score head, served as two named outputs."""

    def __init__(self, features: int = 16, hidden: int = 32, categories: int = 4) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.category = nn.Linear(hidden, categories)
        self.score = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        shared = self.trunk(features)
        return {"category": self.category(shared), "score": torch.sigmoid(self.score(shared))}


class BinnedScorer(nn.Module):
    """Each numeric feature is cut at its own sorted edges (quantiles of the training data, say) and its bin
    embedded."""

    def __init__(self, features: int = 4, bins: int = 8, dim: int = 4) -> None:
        super().__init__()
        self.edges: torch.Tensor  # declared here, not on the class: torch.jit.script cannot read string annotations
        self.offsets: torch.Tensor
        self.register_buffer("edges", torch.linspace(-2.0, 2.0, bins - 1).repeat(features, 1))
        self.register_buffer("offsets", torch.arange(features) * bins)
        self.bins = nn.Embedding(features * bins, dim)
        self.score = nn.Linear(features * dim, 1)

    def forward(self, numeric: torch.Tensor) -> torch.Tensor:
        # searchsorted works row by row over the edges: one row per feature, the batch along it.
        bin_ids = torch.searchsorted(self.edges, numeric.t().contiguous()).t() + self.offsets
        return torch.sigmoid(self.score(self.bins(bin_ids).flatten(1)))
