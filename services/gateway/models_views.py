"""How ``switchyard models`` shows what the admin API answers: rich tables and the live view of a running action."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from services.gateway.admin_client import JSONObject

MARKERS = {"to_flip": "flip", "to_drained": "drained"}
"""Entries of a report's ``steps`` that are times since the action started, not step durations."""


class LiveSteps:
    """The live view: finished steps with their durations, and the running one with how long it has run so far
    (timed here, from when a poll first saw it)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._step: str | None = None
        self._since = time.monotonic()

    def render(self, progress: JSONObject | None) -> RenderableType:
        if progress is None:
            return Text(f"{self.model}: waiting for the gateway …", style="dim")
        step = str(progress.get("step"))
        if step != self._step:
            self._step, self._since = step, time.monotonic()
        grid = Table.grid(padding=(0, 2))
        for name, seconds in _durations(progress.get("steps")):
            grid.add_row(Text("✓", style="green"), Text(name), Text(_ms(seconds), justify="right"))
        finished = progress.get("steps") or {}
        if step not in finished:  # the gateway moves ``step`` on only when the next one starts
            elapsed = f"{time.monotonic() - self._since:.1f} s"
            grid.add_row(Text("…", style="yellow"), Text(step, style="bold"), Text(elapsed))
        title = f"{progress.get('action')} {self.model} version {_v(progress.get('version'))}"
        return Group(Text(title, style="bold"), grid)


def models_table(data: JSONObject) -> RenderableType:
    table = Table("model", "ready", "stable", "previous", "generation", "loaded", "on disk", "problem / action now")
    for row in data.get("models", []):
        note = Text(str(row["problem"]), style="red") if row.get("problem") else Text(_running(row.get("action")))
        table.add_row(
            Text(str(row.get("name"))),
            _yes_no(row.get("ready")),
            Text(_v(row.get("stable"))),
            Text(_v(row.get("previous"))),
            Text(_v(row.get("generation"))),
            Text(_list(row.get("loaded"))),
            Text(_list(row.get("available"))),
            note,
        )
    return table


def status_view(data: JSONObject) -> RenderableType:
    routing = data.get("routing") or {}
    ready = Text("ready", style="green") if data.get("ready") else Text("not ready", style="red")
    head = Text.assemble((str(data.get("name")), "bold"), f"  ({data.get('platform')})  ", ready)
    facts = Table.grid(padding=(0, 2))
    if routing:
        facts.add_row(
            "routing",
            f"stable {_v(routing.get('stable'))}, previous {_v(routing.get('previous'))}, "
            f"generation {_v(routing.get('generation'))}, updated {_when(routing.get('updated_at'))}",
        )
    else:
        facts.add_row("routing", Text("none: unversioned requests are not served", style="red"))
    if data.get("problem"):
        facts.add_row("problem", Text(str(data["problem"]), style="red"))
    loaded = Table("version", "state", "leases", "on disk", "problem", title="loaded versions", title_justify="left")
    for row in data.get("loaded", []):
        role = {routing.get("stable"): " (stable)", routing.get("previous"): " (previous)"}.get(row.get("version"), "")
        loaded.add_row(
            Text(f"{_v(row.get('version'))}{role}"),
            Text(str(row.get("state"))),
            Text(_v(row.get("leases"))),
            _yes_no(row.get("on_disk")),
            Text(str(row.get("problem") or ""), style="red"),
        )
    loaded_versions = {row.get("version") for row in data.get("loaded", [])}
    idle = [v for v in data.get("available", []) if v not in loaded_versions]
    after = Table.grid(padding=(0, 2))
    after.add_row("on disk, not loaded", _list(idle) or "none")
    after.add_row("policy selects", _list(data.get("selected_by_policy")) or "none")
    after.add_row("action now", Text(_running(data.get("action")) or "none"))
    last = data.get("last_action")
    after.add_row("last action", _report_line(last))
    if last and last.get("steps"):
        after.add_row("", _steps(last["steps"]))
    return Group(head, facts, loaded, after)


def events_table(data: JSONObject) -> RenderableType:
    table = Table("time", "action", "versions", "result", "failed step / error", "steps", "actor")
    for event in data.get("events", []):
        failure = ": ".join(str(part) for part in (event.get("step"), event.get("error")) if part)
        versions = _versions(event.get("versions"))
        new = (event.get("detail") or {}).get("new_versions")
        if new:
            versions = f"new on disk: {_list(new)}"
        table.add_row(
            Text(_when(event.get("time"))),
            Text(str(event.get("action"))),
            Text(versions),
            _result(event.get("result")),
            Text(failure, style="red" if event.get("result") == "failed" else ""),
            Text(_steps(event.get("steps"))),
            Text(str(event.get("actor") or "")),
        )
    return table


def scan_view(data: JSONObject) -> RenderableType:
    lines = Table.grid(padding=(0, 2))
    for name, outcome in (data.get("new_models") or {}).items():
        if outcome.get("problem"):
            lines.add_row("new model", Text(name), Text(f"not served: {outcome['problem']}", style="red"))
        else:
            routed = f"routed to version {_v(outcome.get('stable'))} (loaded: {_list(outcome.get('loaded'))})"
            lines.add_row("new model", Text(name), Text(routed))
    for name, versions in (data.get("new_versions") or {}).items():
        lines.add_row("new versions", Text(name), Text(f"{_list(versions)} (served once activated)"))
    for name in data.get("missing_models") or []:
        lines.add_row("missing model", Text(name), Text("gone from the repository; its loaded versions keep serving"))
    if not lines.rows:
        return Text("the repository has not changed since the last scan")
    return lines


def report_view(report: JSONObject) -> RenderableType:
    """An action's answer: what happened, each step's duration, and where unversioned requests go now."""
    action, versions, result = report.get("action"), report.get("versions") or {}, report.get("result")
    title = f"{action} {report.get('model')}"
    if result == "unchanged":
        target = _v(versions.get("to", versions.get("version")))
        already = "already loaded" if action == "load" else "already the stable version"
        return Text.assemble((title, "bold"), f": version {target} is {already}: ", _result(result))
    facts = Table.grid(padding=(0, 2))
    steps = report.get("steps") or {}
    durations = _durations(steps)
    width = max((len(name) for name, _ in durations), default=0)
    for index, (name, seconds) in enumerate(durations):
        facts.add_row("steps" if index == 0 else "", f"{name:<{width}}  {seconds * 1000:>9.1f} ms")
    marks = [f"{label} {_ms(steps[key])}" for key, label in MARKERS.items() if key in steps]
    if marks:
        facts.add_row("from request", ", ".join(marks))
    if report.get("flipped_at"):
        facts.add_row("flipped at", _when(report["flipped_at"], precise=True))
    routing = report.get("routing")
    if routing and action in ("activate", "rollback"):
        facts.add_row(
            "routing",
            f"stable {_v(routing.get('stable'))}, previous {_v(routing.get('previous'))}, "
            f"generation {_v(routing.get('generation'))}",
        )
    comparison = report.get("comparison")
    if comparison:
        diffs = ", ".join(f"{name} {_number(diff)}" for name, diff in (comparison.get("max_abs_diff") or {}).items())
        facts.add_row("max abs diff", Text(f"vs version {_v(comparison.get('against'))}: {diffs or 'no outputs'}"))
    if report.get("drained") is not None:
        left = _v(report.get("in_flight_left"))
        drained = (
            Text(f"yes (in flight left: {left})")
            if report["drained"]
            else Text(f"no: {left} request(s) still in flight when the drain timeout passed", style="yellow")
        )
        facts.add_row("drained", drained)
    if action in ("activate", "rollback"):  # an unload's report names no versions here: the action is the unload
        facts.add_row("unloaded", _list(report.get("unloaded")) or "none")
    if report.get("error"):
        facts.add_row("warning", Text(str(report["error"]), style="yellow"))
    head = Text.assemble((title, "bold"), f": version {_versions(versions)}: ", _result(result))
    return Group(head, facts)


# -- formatting -----------------------------------------------------------------------------------------------
def stdout() -> Console:
    console = Console(highlight=False)
    # Piped output is read by grep and logs: do not fold table cells at 80 columns.
    return console if console.is_terminal else Console(highlight=False, width=max(console.width, 160))


def _running(progress: JSONObject | None) -> str:
    if not progress:
        return ""
    done = _steps(progress.get("steps"))
    return (
        f"{progress.get('action')} of version {_v(progress.get('version'))} at step '{progress.get('step')}'"
        f"{f' (done: {done})' if done else ''}, since {_when(progress.get('started_at'))}"
    )


def _report_line(report: JSONObject | None) -> Text:
    if not report:
        return Text("none")
    line = Text(f"{report.get('action')} {_versions(report.get('versions'))}: ")
    line.append_text(_result(report.get("result")))
    if report.get("step"):
        line.append(f" at step '{report['step']}'", style="red")
    if report.get("error"):
        line.append(f": {report['error']}", style="red" if report.get("result") == "failed" else "yellow")
    line.append(f", {_when(report.get('finished_at'))}")
    return line


def _durations(steps: Any) -> list[tuple[str, float]]:
    if not isinstance(steps, dict):
        return []
    return [(name, float(seconds)) for name, seconds in steps.items() if name not in MARKERS]


def _steps(steps: Any) -> str:
    """``load 12.3 ms, warmup 4.1 ms; from request: flip 17.0 ms``."""
    if not isinstance(steps, dict):
        return ""
    text = ", ".join(f"{name} {_ms(seconds)}" for name, seconds in _durations(steps))
    marks = ", ".join(f"{label} {_ms(steps[key])}" for key, label in MARKERS.items() if key in steps)
    if not marks:
        return text
    return f"{text}; from request: {marks}" if text else f"from request: {marks}"


def _versions(versions: Any) -> str:
    if not isinstance(versions, dict):
        return ""
    if "to" in versions:
        return f"{_v(versions.get('from'))} → {_v(versions['to'])}"
    return ", ".join(f"{_v(value)}" if key == "version" else f"{key} {_v(value)}" for key, value in versions.items())


def _result(result: Any) -> Text:
    style = {"ok": "green", "failed": "bold red", "unchanged": "dim"}.get(str(result), "")
    return Text(str(result), style=style)


def _yes_no(flag: Any) -> Text:
    return Text("yes", style="green") if flag else Text("no", style="red")


def _ms(seconds: Any) -> str:
    value = float(seconds)
    return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.1f} s"


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _v(value: Any) -> str:
    return "none" if value is None else str(value)


def _list(values: Any) -> str:
    return ", ".join(str(v) for v in values) if values else ""


def _when(iso: Any, *, precise: bool = False) -> str:
    """The gateway's UTC ISO times, shorter; as they came when they do not parse."""
    if iso is None:
        return ""
    try:
        moment = dt.datetime.fromisoformat(str(iso)).astimezone(dt.UTC)
    except ValueError:
        return str(iso)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f" if precise else "%Y-%m-%d %H:%M:%S") + " UTC"
