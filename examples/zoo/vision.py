"""Zoo CNNs: a ResNet-style and a MobileNet-style classifier, and a U-Net-style segmenter whose output
follows the input's height and width (both dynamic)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from examples.models import ResidualBlock


def _conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class ResNet(nn.Module):
    """Two residual stages with a strided downsampling between them, global pooling, a linear head."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, width), nn.ReLU())
        self.stage1 = ResidualBlock(width)
        self.down = nn.Sequential(*_conv_bn(width, 2 * width, stride=2), nn.ReLU())
        self.stage2 = ResidualBlock(2 * width)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(image))))
        logits: torch.Tensor = self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return logits


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand 1x1, depthwise 3x3, squeeze-excite, project 1x1; hard-swish throughout."""

    def __init__(self, cin: int, hidden: int, cout: int, stride: int) -> None:
        super().__init__()
        self.expand = nn.Sequential(*_conv_bn(cin, hidden, kernel=1), nn.Hardswish())
        self.depthwise = nn.Sequential(*_conv_bn(hidden, hidden, stride=stride, groups=hidden), nn.Hardswish())
        self.excite = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden, hidden // 4, 1), nn.ReLU(), nn.Conv2d(hidden // 4, hidden, 1),
            nn.Hardsigmoid(),
        )
        self.project = nn.Sequential(*_conv_bn(hidden, cout, kernel=1))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.depthwise(self.expand(x))
        y: torch.Tensor = self.project(hidden * self.excite(hidden))
        return x + y if self.residual else y


class MobileNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, 8, stride=2), nn.Hardswish())
        self.blocks = nn.Sequential(
            InvertedResidual(8, 16, 8, 1), InvertedResidual(8, 32, 16, 2), InvertedResidual(16, 32, 16, 1)
        )
        self.head = nn.Sequential(nn.Linear(16, 32), nn.Hardswish(), nn.Linear(32, classes))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(image))
        logits: torch.Tensor = self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return logits


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(*_conv_bn(cin, cout), nn.ReLU(), *_conv_bn(cout, cout), nn.ReLU())


class UNet(nn.Module):
    """Two poolings down, two resizes up with skip connections; any height and width (odd ones too, as the
    parity gate tries): each upsampling resizes to its skip's size instead of assuming a factor of two."""

    def __init__(self, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.enc1 = _double_conv(3, width)
        self.enc2 = _double_conv(width, 2 * width)
        self.bottom = _double_conv(2 * width, 4 * width)
        self.dec2 = _double_conv(6 * width, 2 * width)
        self.dec1 = _double_conv(3 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        skip1 = self.enc1(image)
        skip2 = self.enc2(F.max_pool2d(skip1, 2))
        x = self.bottom(F.max_pool2d(skip2, 2))
        x = self.dec2(torch.cat([_resize_to(x, skip2), skip2], dim=1))
        x = self.dec1(torch.cat([_resize_to(x, skip1), skip1], dim=1))
        logits: torch.Tensor = self.head(x)
        return logits


def _resize_to(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, size=(like.shape[2], like.shape[3]), mode="bilinear", align_corners=False)
