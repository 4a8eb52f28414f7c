"""Example models built in code with fixed seeds, so every machine exports identical weights.

``*_v2`` factories build the same architecture with other weights: version 2 of each example
answers differently from version 1, which is what a hot version switch must be seen to change.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

CLASSIFIER_INPUT = "image"
CLASSIFIER_SHAPE = (3, 64, 64)
CLASSIFIER_CLASSES = 10
CLASSIFIER_OUTPUT = "logits"

MLP_INPUT = "features"
MLP_FEATURES = 32
MLP_CLASSES = 8


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(x + y)


class Classifier(nn.Module):
    """A small ResNet-style CNN on 3x64x64 images producing 10 logits."""

    def __init__(self, width: int = 48, classes: int = CLASSIFIER_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.stage1 = nn.Sequential(ResidualBlock(width), ResidualBlock(width))
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.stage2 = nn.Sequential(ResidualBlock(2 * width), ResidualBlock(2 * width))
        self.head = nn.Linear(2 * width, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(image))))
        pooled: torch.Tensor = nn.functional.adaptive_avg_pool2d(x, 1)
        logits: torch.Tensor = self.head(torch.flatten(pooled, 1))
        return logits


class MLP(nn.Module):
    """A tiny tabular MLP with two named outputs: raw logits and softmax probabilities."""

    def __init__(self, features: int = MLP_FEATURES, classes: int = MLP_CLASSES) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, classes)
        )

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(features)
        return {"logits": logits, "probabilities": torch.softmax(logits, dim=-1)}


def seeded(module: M, seed: int) -> M:
    """Overwrite every floating parameter and buffer from ``seed`` (matrices scaled by fan-in, vectors near 1),
    so the weights do not depend on torch's global generator; returns the module in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                if tensor.dim() > 1:
                    fan_in = tensor[0].numel()
                    tensor.copy_(torch.randn(tensor.shape, generator=generator) / fan_in**0.5)
                else:
                    tensor.copy_(torch.rand(tensor.shape, generator=generator) * 0.2 + 0.9)
    return module.eval()


def build_classifier() -> nn.Module:
    return seeded(Classifier(), seed=1)


def build_classifier_v2() -> nn.Module:
    return seeded(Classifier(), seed=2)


def build_mlp() -> nn.Module:
    return seeded(MLP(), seed=11)


def build_mlp_v2() -> nn.Module:
    return seeded(MLP(), seed=12)


def classifier_inputs(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn((batch, *CLASSIFIER_SHAPE), generator=torch.Generator().manual_seed(seed))


def mlp_inputs(batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn((batch, MLP_FEATURES), generator=torch.Generator().manual_seed(seed))
