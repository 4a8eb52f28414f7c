"""A zoo recommender: a user embedding and per-field bags of item ids (``nn.EmbeddingBag`` with offsets)
feeding a small scoring MLP."""

from __future__ import annotations

import torch
from torch import nn


class Recommender(nn.Module):
    """``item_ids`` holds each row's items, field after field, padded with id 0; ``offsets`` each field's first
    position in its row (the first field always starts at 0). Offsets come from clients, so they are sorted and
    clamped into the row rather than trusted: a served model must not index out of its row."""

    def __init__(self, users: int = 50, items: int = 200, dim: int = 8, fields: int = 3) -> None:
        super().__init__()
        self.users = nn.Embedding(users, dim)
        self.items = nn.EmbeddingBag(items, dim, mode="sum", padding_idx=0)
        self.score = nn.Sequential(nn.Linear((fields + 1) * dim, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, user: torch.Tensor, item_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        batch, length = item_ids.size(0), item_ids.size(1)
        starts = offsets.clamp(0, length).sort(dim=1).values
        starts = torch.cat([torch.zeros_like(starts[:, :1]), starts[:, 1:]], dim=1)
        row_start = torch.arange(batch, device=item_ids.device).unsqueeze(1) * length
        bags = self.items(item_ids.reshape(-1), (starts + row_start).reshape(-1)).reshape(batch, -1)
        features = torch.cat([self.users(user).reshape(batch, -1), bags], dim=1)
        return torch.sigmoid(self.score(features))
