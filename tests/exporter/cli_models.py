"""Factories the ``switchyard export`` tests point the command at (``tests.exporter.cli_models:build_weighted``)."""

from __future__ import annotations

import torch
from torch import nn


class Weighted(nn.Module):
    """Tells its inputs apart: a served input bound to the other parameter answers 0.001 instead of 2."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b * 0.001


def build_weighted() -> nn.Module:
    return Weighted()


def build_set_pooler() -> nn.Module:
    """A model without a batch dim (``--max-batch-size 0``): a set of 4-vectors of any count in."""
    from tests.unbatched_models import set_pooler

    return set_pooler()
