"""Modules whose ``forward`` decides on its input's values or batch size, and the inputs that take each way.

The factories are importable for ``switchyard export MODULE:FACTORY``; they draw the example from the seed in
``BRANCH_EXAMPLE_SEED`` so a test can sweep the seeds through the command line too.
"""

from __future__ import annotations

import os

import torch
from torch import nn

FEATURES = 16
SEED_VARIABLE = "BRANCH_EXAMPLE_SEED"


class Scorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, 4)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x)
        return out


class SignBranch(Scorer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.scores(x)
        return -self.scores(x)


class BatchBranch(Scorer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 3:
            return self.scores(x)
        return -self.scores(x)


class ItemBranch(Scorer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.max().item() > 1.0:
            return self.scores(x)
        return -self.scores(x)


class UnscriptableSignBranch(SignBranch):
    """The same decision behind a signature ``torch.jit.script`` refuses: only a trace could take it."""

    def forward(self, x: torch.Tensor, **options: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.scores(x)
        return -self.scores(x)


class UnscriptableItemBranch(ItemBranch):
    def forward(self, x: torch.Tensor, **options: torch.Tensor) -> torch.Tensor:
        if x.max().item() > 1.0:
            return self.scores(x)
        return -self.scores(x)


BRANCHING = {"sign": SignBranch, "batch": BatchBranch, "item": ItemBranch}
UNSCRIPTABLE = {"sign": UnscriptableSignBranch, "item": UnscriptableItemBranch}


def example(seed: int, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, FEATURES, generator=torch.Generator().manual_seed(seed))


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return BRANCHING[kind]().eval()


def each_way(kind: str) -> list[torch.Tensor]:
    """Inputs of which some take one way of the decision and some the other, at several batch sizes."""
    rows = torch.randn(32, FEATURES, generator=torch.Generator().manual_seed(99)).abs() + 0.5
    if kind == "sign":
        return [rows[:1], -rows[:1], rows[:7], -rows[:7], rows, -rows]
    if kind == "batch":
        return [rows[:1], rows[:3], rows[:4], rows[:32]]
    return [rows[:1] * 0.1, rows[:1] * 5, rows[:7] * 0.1, rows[:7] * 5, -rows]


def _cli_example(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(kind), {"x": example(int(os.environ.get(SEED_VARIABLE, "0")))}


def sign_model() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return _cli_example("sign")


def batch_model() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return _cli_example("batch")


def item_model() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return _cli_example("item")
