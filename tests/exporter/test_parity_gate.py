"""The parity gate looks where export bugs hide: other signs, scales and the ends of each input's range, at every
batch size; a failure names the draw and puts the likely causes in order."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from exporter import ParityError
from exporter.module_io import prepare
from exporter.parity import Runner, check_parity
from exporter.parity_draws import DRAWS, Stats, draw_inputs
from tests.exporter import branching_models as models

TRACED = "the model was traced (scripting failed: for this test)"


def frozen_trace(module: torch.nn.Module, example: torch.Tensor) -> Runner:
    """What a trace of ``module`` on ``example`` would serve: the way the example went, frozen."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, (example,), check_trace=False)  # type: ignore[no-untyped-call]

    def run(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        with torch.no_grad():
            return [traced(*inputs).numpy()]

    return run


def scaled_eager(module: torch.nn.Module, factor: float) -> Runner:
    def run(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        with torch.no_grad():
            return [(module(*inputs) * factor).numpy()]

    return run


@pytest.mark.slow  # exports models
def test_check_parity_catches_frozen_branch_when_the_examples_sign_never_changes_in_like_draws() -> None:
    module = models.build("sign")
    example = models.example(0).abs() + 1.0  # every sum of draws like it is positive
    prepared = prepare(module, example)

    with pytest.raises(ParityError) as caught:
        check_parity(prepared, frozen_trace(module, example), (1, 7, 32), atol=1e-4, rtol=1e-4, traced=TRACED)

    message = str(caught.value)
    assert "inputs negated, 3x the example's scale" in message
    assert "inputs like the example:" not in message  # the old gate's only draw never saw the other way
    assert message.index("1) the model was traced") < message.index("2) randomness or train-mode layers")
    assert "3) not rounding" in message
    assert "if that is expected" not in message  # no advice to widen a tolerance over a wrong answer


def test_check_parity_suggests_the_tolerance_last_when_the_difference_is_rounding_sized() -> None:
    module = models.build("sign")
    prepared = prepare(module, models.example(1))

    with pytest.raises(ParityError) as caught:
        check_parity(prepared, scaled_eager(module, 1 + 1e-3), (1, 8), atol=1e-5, rtol=1e-5)

    message = str(caught.value)
    assert message.index("1) randomness or train-mode layers") < message.index("2) rounding")
    assert "widen atol/rtol" in message
    assert "traced" not in message


def test_check_parity_passes_every_draw_at_every_batch_size_when_the_export_is_faithful() -> None:
    module = models.build("item")
    prepared = prepare(module, models.example(2))

    def eager(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        with torch.no_grad():
            return [module(*inputs).numpy()]

    report = check_parity(prepared, eager, (1, 7, 32), atol=1e-4, rtol=1e-4)

    assert report.draws == tuple(d.name for d in DRAWS)
    assert {(c.batch_size, c.draw) for c in report.checks} == {(b, d.name) for b in (1, 7, 32) for d in DRAWS}
    assert report.as_dict()["draws"] == list(report.draws)


@pytest.mark.parametrize("batch", [1, 7, 32])
def test_draws_reach_both_ends_of_an_integer_range_when_the_example_spans_it(batch: int) -> None:
    stats = [Stats.of(torch.tensor([[2, 5], [9, 3]])), Stats.of(torch.tensor([[True], [False]]))]
    generator = torch.Generator().manual_seed(0)

    drawn = [draw_inputs(d, stats, [(batch, 2), (batch, 1)], generator) for d in DRAWS]

    integers = [ints for ints, _ in drawn]
    assert all(int(t.min()) >= 2 and int(t.max()) <= 9 for t in integers)
    assert any(bool((t == 2).all()) for t in integers)
    assert any(bool((t == 9).all()) for t in integers)
    flags = [flags for _, flags in drawn]
    assert any(bool(t.all()) for t in flags)
    assert any(not bool(t.any()) for t in flags)


def test_draws_move_sign_and_scale_when_inputs_are_floating_point() -> None:
    stats = [Stats.of(torch.randn(4, 16, generator=torch.Generator().manual_seed(3)) + 2.0)]
    generator = torch.Generator().manual_seed(0)

    drawn = {d.name: draw_inputs(d, stats, [(32, 16)], generator)[0] for d in DRAWS}

    assert float(drawn["like the example"].mean()) > 1.0
    assert abs(float(drawn["centred on zero"].mean())) < 0.5
    assert float(drawn["negated, 3x the example's scale"].mean()) < -3.0
    assert abs(float(drawn["a tenth of the example's scale"].mean())) < 0.5
    extremes = drawn["extremes of the example's range"]
    assert set(np.unique(extremes.numpy())) == {np.float32(stats[0].low), np.float32(stats[0].high)}


def test_check_parity_says_expected_zero_when_the_largest_difference_is_where_eager_answers_zero() -> None:
    module = torch.nn.ReLU()
    prepared = prepare(module, models.example(0))

    def off_at_zero(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        with torch.no_grad():
            return [(module(*inputs) + 0.5 * (inputs[0] <= 0)).numpy()]

    with pytest.raises(ParityError) as caught:
        check_parity(prepared, off_at_zero, (1, 8), atol=1e-4, rtol=1e-4)

    message = str(caught.value)
    assert "max abs 0.5, expected 0 there, so only atol allows a difference (tolerance atol=0.0001, rtol=0.0001: " \
           "|actual - expected| <= atol + rtol * |expected|)" in message
    assert "e+30" not in message  # no relative difference to a 0 (a division by the smallest float)
    assert "max rel" not in message
