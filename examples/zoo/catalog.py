"""The zoo's entries: how to build each model (fixed seeds), its example inputs, and its dynamic axes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from examples.models import seeded
from examples.zoo import detection, recommender, recurrent, tabular, transformers, vision
from exporter.module_io import ExampleInputs
from exporter.specs import Format
from exporter.torch2onnx import DynamicAxes

FORMATS: tuple[Format, ...] = ("onnx", "torchscript")
SEQUENCE = 6
"""Example sequence length; the parity gate also runs 7 and 8 where the length is dynamic."""
IMAGE = 32


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int, int], ExampleInputs]
    """``(batch, seed)`` -> example inputs, as a user passes them to ``export``."""
    dynamic_axes: DynamicAxes | None = None
    refused: Mapping[Format, str] = field(default_factory=dict)
    """Formats that cannot carry the model -> the cause the exporter's refusal must name."""

    def example(self) -> ExampleInputs:
        """The example inputs the zoo exports with."""
        return self.inputs(2, 0)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(batch: int, seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 3, IMAGE, IMAGE, generator=_generator(seed)),)


def _token_ids(batch: int, seed: int) -> tuple[torch.Tensor]:
    return (torch.randint(0, 100, (batch, SEQUENCE), generator=_generator(seed)),)


def _frames(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = _generator(seed)
    frames = torch.randn(batch, SEQUENCE, 8, generator=generator)
    lengths = torch.randint(1, SEQUENCE + 1, (batch, 1), generator=generator)
    lengths[0] = 1  # the gate draws lengths from the examples' range: cover 1 up to the full length
    lengths[-1] = SEQUENCE
    return frames, lengths


def _bert_inputs(batch: int, seed: int) -> dict[str, torch.Tensor]:
    generator = _generator(seed)
    ids = torch.randint(0, 100, (batch, SEQUENCE), generator=generator)
    lengths = torch.randint(1, SEQUENCE + 1, (batch, 1), generator=generator)
    lengths[0] = SEQUENCE - 2  # some padding, so the mask holds both values (the gate draws from their range)
    mask = (torch.arange(SEQUENCE) < lengths).long()
    return {"input_ids": ids, "attention_mask": mask}


def _features(batch: int, seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 16, generator=_generator(seed)),)


def _numeric(batch: int, seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 4, generator=_generator(seed)),)


def _recommender_inputs(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = _generator(seed)
    user = torch.randint(0, 50, (batch, 1), generator=generator)
    items = torch.randint(0, 200, (batch, 12), generator=generator)
    offsets = torch.tensor([[0, 4, 9]]).repeat(batch, 1)
    return user, items, offsets


def _seeded(factory: Callable[[], nn.Module], seed: int) -> Callable[[], nn.Module]:
    return lambda: seeded(factory(), seed)


def _binned_scorer() -> nn.Module:
    model = seeded(tabular.BinnedScorer(), 112)
    with torch.no_grad():  # seeding drew the edges at random: searchsorted needs each row sorted
        model.edges.copy_(model.edges.sort(dim=1).values)
    return model


SEQUENCE_AXIS = {1: "sequence"}

ZOO: tuple[ZooModel, ...] = (
    ZooModel("resnet", _seeded(vision.ResNet, 101), _images),
    ZooModel("mobilenet", _seeded(vision.MobileNet, 102), _images),
    ZooModel("vit", _seeded(transformers.ViT, 103), _images),
    ZooModel("bert", _seeded(transformers.Bert, 104), _bert_inputs,
             dynamic_axes={"input_ids": SEQUENCE_AXIS, "attention_mask": SEQUENCE_AXIS}),
    ZooModel("gpt", _seeded(transformers.Gpt, 105), _token_ids, dynamic_axes={"input_ids": SEQUENCE_AXIS}),
    ZooModel("lstm_tagger", _seeded(recurrent.LstmTagger, 106), _token_ids, dynamic_axes={"tokens": [1]}),
    ZooModel("gru_tagger", _seeded(recurrent.GruTagger, 107), _frames, dynamic_axes={"frames": [1]}),
    ZooModel("unet", _seeded(vision.UNet, 108), _images, dynamic_axes={"image": {2: "height", 3: "width"}}),
    ZooModel("two_heads", _seeded(tabular.TwoHeads, 109), _features),
    ZooModel("recommender", _seeded(recommender.Recommender, 110), _recommender_inputs),
    ZooModel("detector", _seeded(detection.Detector, 111), _images),
    ZooModel("binned_scorer", _binned_scorer, _numeric, refused={"onnx": "aten.searchsorted"}),
)
