"""A zoo detector whose post-processing (``masked_fill``, a fixed ``topk``, ``gather``, ``torch.where``) is
part of the exported graph."""

from __future__ import annotations

import torch
from torch import nn


class Detector(nn.Module):
    """A conv head predicting a box and class scores per cell, then the ``top_k`` most confident cells.

    Cells under ``threshold`` are zeroed before ``topk``, so with fewer confident cells than ``top_k`` it
    picks among tied zeros, in an order engines may choose differently: ``torch.where`` blanks those picks
    (box 0, label -1, ``valid`` false), which keeps the answer deterministic.
    """

    def __init__(self, classes: int = 3, top_k: int = 5, threshold: float = 0.6) -> None:
        super().__init__()
        self.top_k = top_k
        self.threshold = threshold
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()
        )
        self.predict = nn.Conv2d(16, 4 + classes, 1)

    def forward(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        cells = self.predict(self.backbone(image)).flatten(2).transpose(1, 2)  # batch x cells x (4 + classes)
        boxes = torch.sigmoid(cells[:, :, :4])
        confidence, labels = torch.sigmoid(cells[:, :, 4:]).max(dim=2)
        confidence = confidence.masked_fill(confidence < self.threshold, 0.0)
        scores, picked = confidence.topk(self.top_k, dim=1)
        valid = scores > 0
        picked_boxes = boxes.gather(1, picked.unsqueeze(2).expand(-1, -1, 4))
        return {
            "boxes": torch.where(valid.unsqueeze(2), picked_boxes, torch.zeros_like(picked_boxes)),
            "scores": scores,
            "labels": torch.where(valid, labels.gather(1, picked), torch.full_like(picked, -1)),
            "valid": valid,
        }
