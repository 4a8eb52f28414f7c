"""Comparing logged answers with new ones: the tolerances, argmax changes, BYTES equality, status mismatches, the
records that cannot be sent again, the latency figures, and the text that fits 80 columns."""

from __future__ import annotations

from typing import Any

import numpy as np

from services.inferlog.compare import SHADOW_COPY, Answer, ReplayReport, resendable
from services.inferlog.format import encode_tensor, hashed_tensor


def logged(outputs: dict[str, np.ndarray], *, status: int = 200, latency_ms: float = 2.0) -> dict[str, Any]:
    x = np.zeros((2, 3), dtype=np.float32)
    answered = status == 200
    return {
        "format": 1, "id": f"req-{status}", "model": "m", "version": 1, "status": status, "latency_ms": latency_ms,
        "truncated": False, "redacted": [], "request": {"inputs": [encode_tensor("x", "FP32", x)], "outputs": None},
        "response": {"outputs": [encode_tensor(n, "BYTES" if v.dtype == object else "FP32", v)
                                 for n, v in outputs.items()]} if answered else None,
    }


SCORES = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]], dtype=np.float32)


def test_answers_within_the_tolerances_pass_and_beyond_them_fail_with_figures() -> None:
    report = ReplayReport("m", 2, atol=1e-3, rtol=0.0)
    report.add(logged({"scores": SCORES}), Answer(200, {"scores": SCORES + 5e-4}, 1.0))
    assert report.passed
    shifted = SCORES.copy()
    shifted[0] = [0.8, 0.1, 0.1]  # row 0 changes its argmax, row 1 stays
    report.add(logged({"scores": SCORES}), Answer(200, {"scores": shifted}, 1.0))
    figures = report.to_json()["outputs"]["scores"]
    assert not report.passed
    assert (report.compared, report.differing) == (2, 1)
    assert figures["values_off"] == 3
    assert figures["argmax_changed"] == 1
    assert figures["answers_off"] == 1
    assert abs(figures["max_abs_diff"] - 0.7) < 1e-6


def test_bytes_compare_for_equality_and_a_missing_output_or_shape_differs() -> None:
    words = np.array([b"cat", b"dog"], dtype=object)
    report = ReplayReport("m", 2, atol=0.0, rtol=0.0)
    report.add(logged({"label": words}), Answer(200, {"label": np.array([b"cat", b"dog"], dtype=object)}, 1.0))
    assert report.passed
    report.add(logged({"label": words}), Answer(200, {"label": np.array([b"cat", b"cow"], dtype=object)}, 1.0))
    report.add(logged({"label": words, "scores": SCORES}), Answer(200, {"label": words, "scores": SCORES[:1]}, 1.0))
    report.add(logged({"scores": SCORES}), Answer(200, {}, 1.0))
    data = report.to_json()
    assert data["differing"] == 3
    assert data["outputs"]["label"]["values_off"] == 1
    assert data["outputs"]["scores"]["problems"] == {"another shape": 1, "missing from the new answer": 1}


def classes(*rows: list[str]) -> np.ndarray:
    array = np.empty((len(rows), len(rows[0])), dtype=object)
    array[:] = [[entry.encode() for entry in row] for row in rows]
    return array


def test_class_counts_compare_their_scores_within_the_tolerances_and_their_classes_exactly() -> None:
    """A class count answers ``score:index[:label]`` text: an FP16 version's scores differ in the last digits, which
    the tolerances allow; a class that is gone, or whose score moved beyond them, differs."""
    record = logged({"logits": classes(["4.170606:0:cat", "1.193012:6:dog"], ["2.5:3", "2.499999:1"])})
    record["request"]["outputs"] = ["logits"]
    record["request"]["output_parameters"] = {"logits": {"classification": 2}}
    report = ReplayReport("m", 2, atol=1e-3, rtol=1e-3)
    near = classes(["4.170211:0:cat", "1.193514:6:dog"], ["2.499998:1", "2.500001:3"])  # a near tie swapped
    report.add(record, Answer(200, {"logits": near}, 1.0))
    figures = report.to_json()["outputs"]["logits"]
    assert report.passed, report.render()
    assert figures["values_off"] == 0
    assert figures["argmax_changed"] == 1
    assert abs(figures["max_abs_diff"] - 0.000502) < 1e-9
    relabelled = classes(["4.170606:0:cat", "1.193012:5:dog"], ["2.5:3", "2.499999:1"])
    moved = classes(["4.5:0:cat", "1.193012:6:dog"], ["2.5:3", "2.499999:1"])
    for answer in (relabelled, moved):
        report.add(record, Answer(200, {"logits": answer}, 1.0))
    assert report.to_json()["outputs"]["logits"]["values_off"] == 2
    assert (report.compared, report.differing) == (3, 2)
    unasked = logged({"logits": classes(["4.170606:0:cat"])})  # BYTES of no class count: equal or not
    report.add(unasked, Answer(200, {"logits": classes(["4.170607:0:cat"])}, 1.0))
    assert report.differing == 3


def test_status_mismatches_both_ways_and_a_logged_failure_compares_on_status_only() -> None:
    report = ReplayReport("m", 2, atol=1e-5, rtol=1e-4)
    report.add(logged({}, status=400), Answer(400, {}, 1.0, "bad input"))
    assert report.passed
    assert report.status_only == 1
    report.add(logged({"scores": SCORES}), Answer(500, {}, 1.0, "model crashed"))
    report.add(logged({}, status=503), Answer(200, {"scores": SCORES}, 1.0))
    data = report.to_json()
    assert not report.passed
    assert report.failures == 2
    assert [(m["logged"], m["new"]) for m in data["mismatched_requests"]] == [(200, 500), (503, 200)]


def test_records_without_their_inputs_are_named_as_not_resendable() -> None:
    record = logged({"scores": SCORES})
    assert resendable(record) is None
    record["request"]["inputs"] = [hashed_tensor("x", "FP32", np.zeros((2, 3), dtype=np.float32))]
    assert resendable(record) == "inputs not in the log: inputs redacted"
    record["request"]["inputs"] = [{"name": "x", "datatype": "FP32", "shape": [2, 3], "truncated": True}]
    assert resendable(record) == "inputs not in the log: inputs truncated"
    assert resendable(logged({}) | {"redacted": ["secret"]}) == "inputs not in the log: inputs dropped by redaction"
    report = ReplayReport("m", 2, atol=1e-5, rtol=1e-4)
    report.skip("inputs not in the log: inputs truncated")
    assert not report.passed  # nothing compared is no evidence that the version answers alike
    assert report.to_json()["skipped"] == {"inputs not in the log: inputs truncated": 1}


def test_shadow_copies_and_unreadable_inputs_are_skipped_with_their_own_reason() -> None:
    """A shadow copy's answer came from the shadow version: a replay compares with what the clients got."""
    assert resendable(logged({"scores": SCORES}) | {"route": "shadow"}) == SHADOW_COPY
    assert resendable(logged({"scores": SCORES}) | {"route": "canary"}) is None
    record = logged({"scores": SCORES})
    record["request"]["inputs"] = [{"name": "x", "datatype": "FP8", "shape": [1], "data": [1.0]}]
    assert resendable(record) == "inputs not readable: tensor 'x': datatype 'FP8' is not one of " + ", ".join(
        ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16", "FP32",
         "FP64", "BYTES"]
    )


def test_latency_percentiles_and_the_text_fit_80_columns() -> None:
    report = ReplayReport("a-model-with-a-rather-long-name", 12, atol=1e-5, rtol=1e-4)
    for latency in range(1, 101):
        report.add(logged({"scores": SCORES}, latency_ms=float(latency)), Answer(200, {"scores": SCORES}, 2 * latency))
    report.add(logged({"scores": SCORES}), Answer(503, {}, 1.0, "overloaded " * 20))
    latency = report.to_json()["latency_ms"]
    assert (latency["logged"]["p50"], latency["logged"]["p99"]) == (50.0, 99.0)
    assert (latency["new"]["p50"], latency["new"]["p99"]) == (100.0, 198.0)
    text = report.render()
    assert "FAILED" in text
    assert "1 with another status" in text
    assert max(len(line) for line in text.splitlines()) <= 80
