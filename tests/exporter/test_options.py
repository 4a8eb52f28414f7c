"""Export options past what config.pbtxt's fields can hold are refused with the option's own error."""

from __future__ import annotations

import re

import pytest

from exporter import InvalidSpecError
from exporter.specs import ExportOptions, VersionPolicy


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
