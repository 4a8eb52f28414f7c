"""Export options past what config.pbtxt's fields can hold are refused with the option's own error."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import Linear

from exporter import InvalidSpecError, export
from exporter.specs import ExportOptions, VersionPolicy
from tests.exporter.helpers import listing


@pytest.mark.parametrize(("option", "value", "field"), [
    ("max_queue_delay_us", 2**64, "a uint64 (max_queue_delay_microseconds)"),
    ("instances", 10**11, "an int32 (instance_group count)"),
    ("max_batch_size", 2**31, "an int32 (max_batch_size)"),
    ("version", 2**63, "an int64 (a model version)"),
])
def test_export_options_refuse_value_when_its_config_field_cannot_hold_it(option: str, value: int, field: str) -> None:
    with pytest.raises(InvalidSpecError, match=rf"^{option} must lie between \d+ and \d+ \(got {value}\): Triton "
                                               rf"holds it as {re.escape(field)}"):
        ExportOptions(name="m", **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["latest:4294967296", "specific:1,9223372036854775808"])
def test_version_policy_refuses_number_when_its_config_field_cannot_hold_it(text: str) -> None:
    with pytest.raises(InvalidSpecError, match=r"version policy .* must lie between 1 and \d+ \(got \d+\)"):
        VersionPolicy.parse(text)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("option", ["atol", "rtol"])
def test_export_options_refuse_tolerance_when_it_is_not_a_finite_number(option: str, value: float) -> None:
    # NaN passes no comparison (every export fails parity, blamed on rounding); infinity passes any answer.
    with pytest.raises(InvalidSpecError, match=rf"^{option} must be a finite number >= 0 \(got {value}\); leave it "
                                               r"out for the default"):
        ExportOptions(name="m", **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("opset", [0, -1])
def test_export_options_refuse_opset_when_it_is_not_an_opset_version(opset: int) -> None:
    with pytest.raises(InvalidSpecError, match=rf"^opset must be an ONNX opset version >= 1 \(got {opset}\)"):
        ExportOptions(name="m", opset=opset)


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("instances", 2.5, "an integer"),
    ("max_batch_size", "32", "an integer"),
    ("max_queue_delay_us", 1e3, "an integer"),
    ("priority_levels", True, "an integer"),
    ("version", 2.0, "an integer"),
    ("opset", "17", "an integer"),
    ("preferred_batch_sizes", 4, "a list of integers"),
    ("preferred_batch_sizes", [4, 8.5], "an integer"),
    ("atol", "1e-3", "a number"),
    ("release", "yes", "True, False or None"),
])
def test_export_refuses_option_naming_it_when_its_type_is_wrong(
    repo: Path, option: str, value: object, expected: str
) -> None:
    with pytest.raises(InvalidSpecError, match=rf"{option} must be {re.escape(expected)}\b.*\(got "):
        export(Linear(4, 2), torch.randn(2, 4), name="m", repository=repo, **{option: value})  # type: ignore[arg-type]
    assert listing(repo) == []


def test_export_options_keep_integer_options_as_ints_when_given_numpy_integers() -> None:
    options = ExportOptions(name="m", instances=np.int64(3), preferred_batch_sizes=(np.int32(4),))  # type: ignore[arg-type]

    assert type(options.instances) is int
    assert options.instances == 3
    assert options.preferred_batch_sizes == (4,)
    assert type(options.preferred_batch_sizes[0]) is int


@pytest.mark.parametrize("opset", [30, 6])
def test_export_names_the_opsets_the_exporters_write_when_opset_is_past_them(repo: Path, opset: int) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        export(Linear(4, 2), torch.randn(2, 4), name="m", repository=repo, opset=opset)

    message = str(caught.value)
    assert message.startswith(f"opset={opset} is not one the installed ONNX exporters can write: torch ")
    assert re.search(r"writes opsets 7 to \d\d ", message), message
    assert "format='torchscript'" not in message
    assert listing(repo) == []
