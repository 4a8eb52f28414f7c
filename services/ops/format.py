"""How ``switchyard models`` writes the admin API's values: versions, durations, times, results, action lines."""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from services.ops.client import JSONObject

MARKERS = {"to_flip": "flip", "to_drained": "drained"}
"""Entries of a report's ``steps`` that are times since the action started, not step durations."""

Shown = TypeVar("Shown")


def stdout() -> Console:
    console = Console(highlight=False)
    # Piped output is read by grep and logs: do not fold table cells at 80 columns.
    return console if console.is_terminal else Console(highlight=False, width=max(console.width, 160))


def whole(view: Shown) -> Shown:
    """``view`` (a table, or a group of them) with every column folding a word too long for it onto the next line:
    at 80 columns rich would cut it with "…", and a cut version list, error or figure misleads. Call it on the
    finished view: a grid makes its columns as its first row comes in."""
    if isinstance(view, Table):
        for column in view.columns:
            column.overflow = "fold"
    elif isinstance(view, Group):
        for part in view.renderables:
            whole(part)
    return view


def running(progress: JSONObject | None) -> str:
    if not progress:
        return ""
    done = steps_text(progress.get("steps"))
    return (
        f"{progress.get('action')} of version {v(progress.get('version'))} at step '{progress.get('step')}'"
        f"{f' (done: {done})' if done else ''}, since {when(progress.get('started_at'))}"
    )


def report_line(report: JSONObject | None, what: str | None = None) -> Text:
    """``activate 1 → 2: ok, <when>``; ``what`` replaces the versions (a traffic action says what it set)."""
    if not report:
        return Text("none")
    line = Text(f"{report.get('action')} {what or versions_text(report.get('versions'))}: ")
    line.append_text(result_text(report.get("result")))
    if report.get("step"):
        line.append(f" at step '{report['step']}'", style="red")
    if report.get("error"):
        line.append(f": {report['error']}", style="red" if report.get("result") == "failed" else "yellow")
    line.append(f", {when(report.get('finished_at'))}")
    return line


def durations(steps: Any) -> list[tuple[str, float]]:
    if not isinstance(steps, dict):
        return []
    return [(name, float(seconds)) for name, seconds in steps.items() if name not in MARKERS]


def steps_text(steps: Any) -> str:
    """``load 12.3 ms, warmup 4.1 ms; from request: flip 17.0 ms``."""
    if not isinstance(steps, dict):
        return ""
    text = ", ".join(f"{name} {ms(seconds)}" for name, seconds in durations(steps))
    marks = ", ".join(f"{label} {ms(steps[key])}" for key, label in MARKERS.items() if key in steps)
    if not marks:
        return text
    return f"{text}; from request: {marks}" if text else f"from request: {marks}"


def versions_text(versions: Any) -> str:
    if not isinstance(versions, dict):
        return ""
    if "to" in versions:
        return f"{v(versions.get('from'))} → {v(versions['to'])}"
    return ", ".join(f"{v(value)}" if key == "version" else f"{key} {v(value)}" for key, value in versions.items())


def result_text(result: Any) -> Text:
    style = {"ok": "green", "failed": "bold red", "unchanged": "dim"}.get(str(result), "")
    return Text(str(result), style=style)


def yes_no(flag: Any) -> Text:
    return Text("yes", style="green") if flag else Text("no", style="red")


def ms(seconds: Any) -> str:
    value = float(seconds)
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.1f} s"


def number(value: Any) -> str:
    """Three significant digits, never in exponent form for what a person types (``1000``, not ``1e+03``)."""
    if not isinstance(value, float):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.3e}"


def percent(fraction: Any) -> str:
    """``0.05`` → ``5%``, ``0.0213`` → ``2.13%``."""
    return f"{float(fraction) * 100:.3g}%"


def v(value: Any) -> str:
    return "none" if value is None else str(value)


def listed(values: Any) -> str:
    return ", ".join(str(value) for value in values) if values else ""


def when(iso: Any, *, precise: bool = False) -> str:
    """The gateway's UTC ISO times in the console's one form, ``2026-12-04 15:35:43Z`` (``precise``: to the
    microsecond, to match a flip with request logs); as they came when they do not parse."""
    if iso is None:
        return ""
    try:
        moment = dt.datetime.fromisoformat(str(iso)).astimezone(dt.UTC)
    except ValueError:
        return str(iso)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f" if precise else "%Y-%m-%d %H:%M:%S") + "Z"
