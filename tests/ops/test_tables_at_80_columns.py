"""The ``switchyard models`` and ``tune`` tables at 80 columns: a cell too wide for its column wraps onto the next
lines, whole, where rich would cut its end with "…"."""

from __future__ import annotations

import io

from rich.console import Console, RenderableType

from services.ops.models_views import models_table, report_view, status_view
from services.ops.tune_views import trials_table

PROBLEM = "version 3 failed to load: onnxruntime INVALID_GRAPH in model.onnx_exported_without_its_external_data"


def columns_at_80(view: RenderableType) -> list[str]:
    """Each column's body cells, read top to bottom with the spaces dropped: what a reader gets of one row."""
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(view)
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert [line for line in lines if len(line) > 80] == []
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("┡")) + 1 : -1]
    cells = [line.split("│")[1:-1] for line in body]
    return ["".join(row[index] for row in cells).replace(" ", "") for index in range(len(cells[0]))]


def test_models_table_keeps_every_cell_whole_when_80_columns_wide() -> None:
    row = {"name": "resnet50_image_classifier_int8", "ready": False, "stable": 12, "previous": 11, "generation": 4096,
           "loaded": [10, 11, 12], "available": list(range(1, 14)), "problem": PROBLEM,
           "canary": {"version": 13, "weight": 12.5}, "shadow": {"version": 14, "percent": 50}}

    cells = columns_at_80(models_table({"models": [row]}))

    assert cells == ["resnet50_image_classifier_int8", "no", "12", "11", "4096", "10,11,12",
                     ",".join(str(v) for v in range(1, 14)), PROBLEM.replace(" ", ""), "canary13@12.5%,shadow14@50%"]


def test_trials_table_keeps_every_cell_whole_when_80_columns_wide() -> None:
    trial = {"number": 1, "round": 1, "label": "i4 d2000us p[4,8,16,32] b64", "default": True, "measurements": [
        {"concurrency": 32, "throughput": 12345.6, "p50_ms": 1.23, "p99_ms": 123.45, "cpu_ms_per_request": 0.123,
         "errors": 3}]}
    run = {"model": "resnet50_image_classifier_int8", "version": 3, "options": {"p99_ms": 25.0}, "winner": None,
           "trials": [trial]}

    cells = columns_at_80(trials_table(run))

    assert cells == ["1", "1", "i4d2000usp[4,8,16,32]b64", "32", "12346", "1.23", "123.45", "0.123", "current3errors"]


def test_status_names_the_versions_not_released_and_what_serves_them() -> None:
    status = {"name": "mlp", "platform": "onnxruntime_onnx", "ready": True, "traffic": None, "loaded": [],
              "routing": {"stable": 2, "previous": None, "generation": 1, "updated_at": "2026-12-05T01:03:51+00:00"},
              "available": [1, 2, 3], "unreleased": [3], "selected_by_policy": [1, 2, 3], "problem": None,
              "action": None, "last_action": None}
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(status_view(status))
    text = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert "not released 3 (served unversioned only once activated)" in text
    assert "updated 2026-12-05 01:03:51Z" in text


def test_an_action_report_names_each_other_workers_steps_or_its_trouble() -> None:
    report = {"model": "mlp", "action": "activate", "result": "ok", "versions": {"from": 2, "to": 1},
              "steps": {"load": 0.001, "flip": 0.003, "to_flip": 0.009}, "routing": {"stable": 1, "previous": 2},
              "workers": {"1": {"load": 0.0004, "follow": 0.0003}, "2": {"error": "cannot take routing generation 5"},
                          "3": {"note": "worker 3 is not running (it is starting or being restarted)"}}}
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(report_view(report))
    text = " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]
    assert "other workers worker 1: load 0.4 ms, follow 0.3 ms" in text
    assert "worker 2: cannot take routing generation 5" in text
    assert "worker 3: worker 3 is not running" in text
