"""Modules whose ``forward`` decides on its input's values or batch size, and the inputs that take each way.

The factories are importable for ``switchyard export MODULE:FACTORY``; they take the example ``examples(kind)``
holds at the index in ``BRANCH_EXAMPLE`` so a test can go through them on the command line too.
"""

from __future__ import annotations

import os

import torch
from torch import nn

FEATURES = 16
EXAMPLE_VARIABLE = "BRANCH_EXAMPLE"


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
MAX_BATCH_SIZE = {"sign": 1, "batch": 32, "item": 32}
"""What each model is exported with. A decision on a whole batch's values makes a row's answer depend on the other
rows, which a dynamic batcher merging clients' requests must not see (``RowDependenceError``): the sign model is
served one row per request, where deciding on the request's values is deciding on the row's. The batch model's
decision on the batch size is refused batched whatever is done (``RowDependenceError``, after the parity gate kept
both ways), and means nothing one row at a time."""
KEPT_BOTH_WAYS = ("item", "sign")
"""The models an export publishes (the item model's draws never split a batch across its threshold)."""
UNSCRIPTABLE = {"sign": UnscriptableSignBranch, "item": UnscriptableItemBranch}


def example(seed: int, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, FEATURES, generator=torch.Generator().manual_seed(seed))


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return BRANCHING[kind]().eval()


def examples(kind: str) -> list[torch.Tensor]:
    """Examples an export may be given, taking each way of the decision, two of each for the sign (seeds whose row
    sums below and above 0: one row, as ``MAX_BATCH_SIZE`` serves it): whichever way the example takes, the export
    must keep both. Random draws alone would not do: every seed's example of 4 rows has a value above 1.0 and more
    than 3 rows."""
    if kind == "sign":
        return [example(seed, batch=1) for seed in (0, 3, 1, 8)]
    if kind == "batch":
        return [example(0, batch=2), example(0, batch=4)]
    return [example(0) * 0.1, example(0)]


def each_way(kind: str) -> list[torch.Tensor]:
    """Inputs of which some take one way of the decision and some the other, at several batch sizes."""
    rows = torch.randn(32, FEATURES, generator=torch.Generator().manual_seed(99)).abs() + 0.5
    if kind == "sign":
        return [rows[:1], -rows[:1], rows[:7], -rows[:7], rows, -rows]
    if kind == "batch":
        return [rows[:1], rows[:3], rows[:4], rows[:32]]
    return [rows[:1] * 0.1, rows[:1] * 5, rows[:7] * 0.1, rows[:7] * 5, -rows]


def _cli_example(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(kind), {"x": examples(kind)[int(os.environ.get(EXAMPLE_VARIABLE, "0"))]}


def sign_model() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return _cli_example("sign")


def batch_model() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return _cli_example("batch")


def item_model() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return _cli_example("item")
