"""The parity gate's inputs: draws that look where export bugs hide, not only where the example lies.

A branch frozen by a trace, a constant folded from one value, a kernel that differs at the edges of the range:
inputs drawn like the example keep the example's mean, sign and magnitude, so they take the same way through the
model as the example did. Each draw below moves one of those, for every input at once (a model may decide on
their combination), with its own random stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stats:
    """What a draw needs to know of an example input: its dtype and the range and spread of its values."""

    dtype: torch.dtype
    low: float
    high: float
    mean: float
    std: float

    @classmethod
    def of(cls, example: torch.Tensor) -> Stats:
        as_float = example.double()
        std = float(as_float.std()) if example.numel() > 1 else 1.0
        return cls(example.dtype, float(as_float.min()), float(as_float.max()), float(as_float.mean()), std or 1.0)


Maker = Callable[[Stats, tuple[int, ...], torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class Draw:
    name: str
    """How the draw's values relate to the example, as a parity failure names it."""
    make: Maker


def like_example(stats: Stats, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """The example's mean and spread (floats); any value of its range (integers); either (bools)."""
    if stats.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if not stats.dtype.is_floating_point:
        return torch.randint(int(stats.low), int(stats.high) + 1, shape, generator=generator, dtype=stats.dtype)
    return _normal(shape, generator, stats.mean, stats.std).to(stats.dtype)


def centred(stats: Stats, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Around zero with the example's spread: sums and means of either sign."""
    if not stats.dtype.is_floating_point:
        return like_example(stats, shape, generator)
    return _normal(shape, generator, 0.0, stats.std).to(stats.dtype)


def negated_and_grown(stats: Stats, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """The example's draw negated and three times larger (floats): the other sign, past thresholds; integers at
    the top of their range, bools all true."""
    if stats.dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    if not stats.dtype.is_floating_point:
        return torch.full(shape, int(stats.high), dtype=stats.dtype)
    return (_normal(shape, generator, stats.mean, stats.std) * -3.0).to(stats.dtype)


def shrunk(stats: Stats, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """The example's draw a tenth as large (floats): under thresholds the example passes; integers at the bottom
    of their range, bools all false."""
    if stats.dtype == torch.bool:
        return torch.zeros(shape, dtype=torch.bool)
    if not stats.dtype.is_floating_point:
        return torch.full(shape, int(stats.low), dtype=stats.dtype)
    return (_normal(shape, generator, stats.mean, stats.std) * 0.1).to(stats.dtype)


def extremes(stats: Stats, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Every value the lowest or the highest of the example's range."""
    pick_high = torch.randint(0, 2, shape, generator=generator).bool()
    if stats.dtype == torch.bool:
        return pick_high
    low = torch.full(shape, stats.low, dtype=torch.float64)
    high = torch.full(shape, stats.high, dtype=torch.float64)
    return torch.where(pick_high, high, low).to(stats.dtype)


DRAWS: tuple[Draw, ...] = (
    Draw("like the example", like_example),
    Draw("centred on zero", centred),
    Draw("negated, 3x the example's scale", negated_and_grown),
    Draw("a tenth of the example's scale", shrunk),
    Draw("extremes of the example's range", extremes),
)


def draw_inputs(
    draw: Draw, stats: Sequence[Stats], shapes: Sequence[tuple[int, ...]], generator: torch.Generator
) -> tuple[torch.Tensor, ...]:
    return tuple(draw.make(s, shape, generator) for s, shape in zip(stats, shapes, strict=True))


def _normal(shape: tuple[int, ...], generator: torch.Generator, mean: float, std: float) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float64) * std + mean
